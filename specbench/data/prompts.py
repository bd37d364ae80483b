"""Render a conversation into prompt token ids: the model's chat template, or raw completion text."""

from __future__ import annotations

from specbench.errors import ConfigError


def conversation(system_prompt: str | None, turns: list[str], answers: list[str]) -> list[dict]:
    """Chat messages for the next turn: system, then alternating user turns and the model's answers."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for i, user in enumerate(turns):
        messages.append({"role": "user", "content": user})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def resolve_format(tokenizer, prompt_format: str) -> str:
    """``auto`` -> ``chat`` when the tokenizer has a chat template, else ``raw``; checks ``chat``."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" and not has_template:
        raise ConfigError("this tokenizer has no chat template: run with dataset.prompt_format=raw "
                          "(or auto), or give model.chat_template")
    if prompt_format == "auto":
        return "chat" if has_template else "raw"
    return prompt_format


def render(tokenizer, messages: list[dict], prompt_format: str) -> list[int]:
    """Token ids of the prompt for the last user message in ``messages``.

    ``chat`` applies the tokenizer's chat template with the generation prompt; ``raw`` joins the
    message contents with blank lines (completion prompts for base models and code completion).
    """
    if resolve_format(tokenizer, prompt_format) == "chat":
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    text = "\n\n".join(m["content"] for m in messages)
    return tokenizer(text)["input_ids"]
