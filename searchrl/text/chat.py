"""Prompts as text or as chat messages: an env returns either, the tokenizer's own chat template
renders messages.

Instruct models are trained on their chat template; a prompt written as messages is rendered with
`tokenizer.apply_chat_template` from the local tokenizer directory, so it matches the model byte for byte.
A final "assistant" message is a prefix the model continues (e.g. "Let me think.\n<think>\n"). A `Chat`
also carries the template's own switches, e.g. Qwen3's `enable_thinking`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence, Union

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}


@dataclasses.dataclass(frozen=True)
class Chat:
    """Messages and the keyword arguments the chat template is rendered with (e.g. enable_thinking)."""

    messages: tuple[Message, ...]
    template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


Prompt = Union[str, Sequence[Message], Chat]

ROLES = ("system", "user", "assistant")


def messages(system: str, user: str, assistant_prefix: str = "") -> list[dict[str, str]]:
    """The chat of a single-turn task: an optional system message, the user's message and an optional
    assistant prefix to continue."""
    out = [{"role": "system", "content": system}] if system else []
    out.append({"role": "user", "content": user})
    if assistant_prefix:
        out.append({"role": "assistant", "content": assistant_prefix})
    return out


def _check(chat: Sequence[Message]) -> None:
    if not chat:
        raise ValueError("A chat prompt needs at least one message.")
    for i, message in enumerate(chat):
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise ValueError(f"Chat message {i} must be {{'role': one of {ROLES}, 'content': str}}, "
                             f"got {dict(message)!r:.200}")


def render(tokenizer: Any, prompt: Prompt) -> str:
    """The prompt's text: a string as it is; messages through the tokenizer's chat template, with the
    generation prompt added, or the final assistant message continued."""
    if isinstance(prompt, str):
        return prompt
    chat = prompt if isinstance(prompt, Chat) else Chat(tuple(prompt))
    prompt = chat.messages
    _check(prompt)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("The prompt is a chat, but the tokenizer has no chat template (set the env's chat "
                         "template option off, or use an instruct model's tokenizer directory).")
    continues = prompt[-1]["role"] == "assistant"
    text = tokenizer.apply_chat_template([dict(m) for m in prompt], tokenize=False,
                                         add_generation_prompt=not continues,
                                         continue_final_message=continues, **chat.template_kwargs)
    final = prompt[-1]["content"]
    if continues and not text.endswith(final) and text.endswith(final.rstrip()):
        # some transformers versions cut the continued message's whitespace
        text += final[len(final.rstrip()):]
    return text
