"""Fixtures for the model tests."""
import pytest

from tests.models.model_helpers import build_hf_model


@pytest.fixture
def hf_checkpoint(tmp_path):
    """Factory: (name, **save_kwargs) -> (torch model, checkpoint dir)."""
    def make(name: str, **save_kwargs):
        model = build_hf_model(name)
        path = tmp_path / name
        model.save_pretrained(path, **save_kwargs)
        return model, path

    return make
