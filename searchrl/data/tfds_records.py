"""A reader's records stored once as a TFDS dataset (ArrayRecord files, read without TensorFlow) and read
back on demand, each the very dict the reader returned.

Fields are stored by the record type's annotations: str as Text, list[str] as a Sequence of Text,
dict[str, int] (qrels) as a Sequence of {key, value: int64} in dict order, dict[str, Any] (QA metadata) as
JSON text. A value that would not come back the same (metadata JSON cannot hold exactly, a relevance beyond
int64) fails the build with a DataFormatError naming the record.

`prepared` writes a build in a temporary folder beside its destination and renames it into place: processes
that prepare the same destination at once leave one complete copy, with no coordination between them. A
build that cannot be read back (its files damaged since) fails with one line naming the folder to delete
(`cli.Damaged`), when it is opened or when a damaged record is read, never with the readers' own errors.
"""
from __future__ import annotations

import contextlib
import functools
import json
import operator
import os
import tempfile
import typing
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from searchrl import cli
from searchrl.data.jsonl import DataFormatError

_SPLIT = "records"  # a build's one split (which split of the source it holds is in its folder's name)
_READ_CHUNK = 1024  # records decoded per batched read when iterating
_INT64 = np.iinfo(np.int64)


def _text(value: bytes) -> str:
    return value.decode("utf-8")


def _is_json(value: Any) -> bool:
    """Whether JSON gives `value` back exactly: objects with str keys, lists, str, numbers, bools, None."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    return value is None or isinstance(value, (str, int, float))


def _encode_json(value: dict[str, Any]) -> str:
    if not _is_json(value):
        raise ValueError("JSON cannot store it exactly (only objects with string keys, lists, strings, "
                         "numbers, booleans and null)")
    return json.dumps(value, ensure_ascii=False)


def _encode_qrels(value: dict[str, int]) -> dict[str, list]:
    if not all(_INT64.min <= score <= _INT64.max for score in value.values()):
        raise ValueError("a relevance beyond the int64 range")
    return {"key": list(value), "value": list(value.values())}


class _Codec(NamedTuple):
    feature: Callable[[], tfds.features.FeatureConnector]
    encode: Callable[[Any], Any]  # record value -> stored value
    decode: Callable[[Any], Any]  # read value -> record value


_CODECS = {  # a record field's annotation: its codec
    str: _Codec(tfds.features.Text, str, _text),
    list[str]: _Codec(lambda: tfds.features.Sequence(tfds.features.Text()), list,
                      lambda v: [_text(x) for x in v]),
    dict[str, int]: _Codec(
        lambda: tfds.features.Sequence({"key": tfds.features.Text(),
                                        "value": tfds.features.Scalar(np.int64)}),
        _encode_qrels, lambda v: dict(zip(map(_text, v["key"]), map(int, v["value"])))),
    dict[str, Any]: _Codec(tfds.features.Text, _encode_json, lambda v: json.loads(_text(v))),
}


def _codecs(record_type: type) -> dict[str, _Codec]:
    """Each field of a record TypedDict with its codec."""
    hints = typing.get_type_hints(record_type)
    unknown = {name: hint for name, hint in hints.items() if hint not in _CODECS}
    if unknown:
        raise TypeError(f"{record_type.__name__}: no TFDS codec for the fields {unknown}")
    return {name: _CODECS[hint] for name, hint in hints.items()}


def _encode(codecs: dict[str, _Codec], record: dict, where: str) -> dict[str, Any]:
    out = {}
    for name, codec in codecs.items():
        try:
            out[name] = codec.encode(record[name])
        except (ValueError, RecursionError) as e:
            raise DataFormatError(where, f"cannot be stored: {e}", name) from None
    return out


def _decode(codecs: dict[str, _Codec], tags: dict[str, str], example: dict[str, Any]) -> dict:
    return {**{name: codec.decode(example[name]) for name, codec in codecs.items()}, **tags}


class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """One split of records, in the reader's order."""

    name = "searchrl_records"
    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, *, records: Sequence[dict], record_type: type, where: str, **kwargs):
        self._records, self._codecs, self._where = records, _codecs(record_type), where
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        features = tfds.features.FeaturesDict({name: codec.feature() for name, codec in self._codecs.items()})
        return tfds.core.DatasetInfo(builder=self, description=f"The records of {self._where}.",
                                     features=features, disable_shuffling=True)

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        return {_SPLIT: self._generate_examples()}

    def _generate_examples(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, record in enumerate(self._records):
            yield i, _encode(self._codecs, record, f"{self._where}: record {i} (id {record.get('id')!r})")

    def _log_download_bytes(self) -> None:  # TFDS prints a download notice here; nothing is downloaded
        logging.info("Preparing %s", self._where)

    def _log_download_done(self) -> None:
        pass


@contextlib.contextmanager
def _reading(build_dir: str) -> Iterator[None]:
    """Turns any failure to read a build (TFDS's metadata, ArrayRecord's Riegeli files, the decoding) into
    one line naming the folder to delete."""
    try:
        yield
    except cli.Damaged:
        raise
    except Exception as e:  # whatever the damage: the readers raise RuntimeError, ValueError, protobuf errors
        raise cli.Damaged("the prepared TFDS copy", build_dir, e) from e


class _Part(NamedTuple):
    source: Sequence[Any]  # random access to a build's stored examples
    decode: Callable[[Any], dict]
    build_dir: str


class Records(Sequence[dict]):
    """Stored records, one build after another, read and decoded on demand: `records[i]` reads one, a slice
    reads the ones it names (into a list), iteration reads them in chunks."""

    def __init__(self, parts: Sequence[_Part]):
        self._parts = list(parts)
        self._starts = np.cumsum([0] + [len(part.source) for part in self._parts])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        i += len(self) if i < 0 else 0
        if not 0 <= i < len(self):
            raise IndexError(f"record {index} of {len(self)}")
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        part = self._parts[k]
        with _reading(part.build_dir):
            return part.decode(part.source[i - int(self._starts[k])])

    def __iter__(self) -> Iterator[dict]:
        for part in self._parts:
            for start in range(0, len(part.source), _READ_CHUNK):
                with _reading(part.build_dir):
                    chunk = range(start, min(start + _READ_CHUNK, len(part.source)))
                    records = list(map(part.decode, part.source.__getitems__(chunk)))
                yield from records

    @classmethod
    def concatenate(cls, records: Iterable[Records]) -> Records:
        return cls([part for r in records for part in r._parts])


def _load(build_dir: str, record_type: type, tags: dict[str, str]) -> Records:
    """The build's records; its metadata and its first and last records are read here, so that damage there
    fails at once."""
    decode = functools.partial(_decode, _codecs(record_type), tags)
    with _reading(build_dir):
        records = Records([_Part(tfds.builder_from_directory(build_dir).as_data_source(_SPLIT), decode,
                                 build_dir)])
    if len(records):  # damage to the files' ends fails here, not in the middle of a run
        _ = records[0], records[-1]
    return records


def prepared(build_dir: str, read: Callable[[], Sequence[dict]], record_type: type, where: str,
             tags: dict[str, str]) -> Records:
    """The records stored at build_dir, each with `tags` added; read()'s records (a `record_type` each) are
    stored there first when nothing is. `where` names the records in messages. No records: nothing to store
    (TFDS stores no empty split), and read() runs again next time."""
    if not os.path.isdir(build_dir):
        records = read()
        if not records:
            return Records([])
        parent = os.path.dirname(os.path.abspath(build_dir))
        os.makedirs(parent, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=parent, prefix=".building-") as tmp:
            builder = _Builder(records=records, record_type=record_type, where=where, data_dir=tmp,
                               file_format="array_record")
            builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
            try:
                os.rename(builder.data_dir, build_dir)
            except OSError:
                if not os.path.isdir(build_dir):  # else another process stored the same records first
                    raise
    return _load(build_dir, record_type, tags)
