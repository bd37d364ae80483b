"""Render a conversation into a prompt: the model's chat template, the papers' templates, or raw text.

Formats (``dataset.prompt_format``):

- ``chat``: the tokenizer's own chat template, with the generation prompt.
- ``raw``: completion text for base models (datasets may define their own, e.g. a 1-shot prompt).
- ``vicuna``: FastChat's "vicuna_v1.1" conversation (Medusa, OPT-Tree and Spec-Bench with Vicuna):
  ``{system} USER: {q1} ASSISTANT: {a1}</s>USER: {q2} ASSISTANT:``; the system line defaults to
  Vicuna's ("A chat between a curious user ..."); a configured ``system_prompt`` replaces it.
- ``llama2``: FastChat's / Meta's "llama-2" conversation (Self-Draft uses it for every model):
  ``[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{q1} [/INST] {a1} </s><s>[INST] {q2} [/INST]``; without a
  ``system_prompt`` the ``<<SYS>>`` block is left out (``[INST] {q1} [/INST]``).
- ``auto``: ``chat`` when the tokenizer has a chat template, else ``raw``.

The text formats are tokenized with the tokenizer's special tokens (a Llama tokenizer prepends BOS,
and reads the literal ``</s>`` / ``<s>`` as EOS / BOS, as the papers' code did); a chat-template
text already holds its special tokens, so it is tokenized without adding any. Earlier answers are
stripped of surrounding whitespace in the paper templates, as FastChat does before storing them.
"""

from __future__ import annotations

from specbench.errors import ConfigError

PROMPT_FORMATS = ("auto", "chat", "raw", "vicuna", "llama2")
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


def conversation(system_prompt: str | None, turns: list[str], answers: list[str]) -> list[dict]:
    """Chat messages for the next turn: system, then alternating user turns and the model's answers."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for i, user in enumerate(turns):
        messages.append({"role": "user", "content": user})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def check_format(prompt_format: str) -> None:
    """Reject a prompt format name that is not one of ``PROMPT_FORMATS``."""
    if prompt_format not in PROMPT_FORMATS:
        raise ConfigError(f"dataset.prompt_format must be one of {PROMPT_FORMATS}; got {prompt_format!r}")


def resolve_format(tokenizer, prompt_format: str) -> str:
    """``auto`` -> ``chat`` when the tokenizer has a chat template, else ``raw``; checks ``chat``."""
    check_format(prompt_format)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" and not has_template:
        raise ConfigError(
            "this tokenizer has no chat template: run with dataset.prompt_format=raw "
            "(or auto, vicuna, llama2), or give model.chat_template"
        )
    if prompt_format == "auto":
        return "chat" if has_template else "raw"
    return prompt_format


def split_system(messages: list[dict]) -> tuple[str | None, list[dict]]:
    """The system message's content (or None) and the user/assistant messages after it."""
    if messages and messages[0]["role"] == "system":
        return messages[0]["content"], messages[1:]
    return None, messages


def raw_text(messages: list[dict]) -> str:
    """Completion text: the message contents joined with blank lines (base models, code completion)."""
    return "\n\n".join(m["content"] for m in messages)


def vicuna_text(messages: list[dict]) -> str:
    """FastChat's vicuna_v1.1 prompt, ending in ``ASSISTANT:`` for the next answer."""
    system, dialogue = split_system(messages)
    text = (system or VICUNA_SYSTEM) + " "
    for message in dialogue:
        if message["role"] == "user":
            text += f"USER: {message['content']} ASSISTANT:"
        else:
            text += f" {message['content'].strip()}</s>"
    return text


def llama2_text(messages: list[dict]) -> str:
    """The llama-2 chat prompt, ending in ``[/INST]`` for the next answer."""
    system, dialogue = split_system(messages)
    text = f"[INST] <<SYS>>\n{system}\n<</SYS>>\n\n" if system else "[INST] "
    for i, message in enumerate(dialogue):
        if message["role"] == "user":
            text += ("" if i == 0 else "[INST] ") + f"{message['content']} [/INST]"
        else:
            text += f" {message['content'].strip()} </s><s>"
    return text


TEXT_FORMATS = {"raw": raw_text, "vicuna": vicuna_text, "llama2": llama2_text}


def prompt_text(tokenizer, messages: list[dict], fmt: str) -> str:
    """The prompt string for the last user message in ``messages``, in a resolved format."""
    if fmt == "chat":
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return TEXT_FORMATS[fmt](messages)


def encode(tokenizer, text: str, fmt: str) -> list[int]:
    """Token ids of a prompt string; only non-chat formats get the tokenizer's special tokens (BOS)."""
    return list(tokenizer(text, add_special_tokens=fmt != "chat")["input_ids"])


def render(tokenizer, messages: list[dict], prompt_format: str) -> list[int]:
    """Token ids of the prompt for the last user message in ``messages`` in ``prompt_format``."""
    fmt = resolve_format(tokenizer, prompt_format)
    return encode(tokenizer, prompt_text(tokenizer, messages, fmt), fmt)
