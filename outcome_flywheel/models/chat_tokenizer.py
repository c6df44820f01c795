"""`ChatTokenizer`: the base class `TorchBackend` and `MLXBackend` share for their text side."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from outcome_flywheel.models.interface import THINK_TOKENS, Messages, SamplingConfig


class ChatTokenizer:
    """The text side both backends share: one Hugging Face tokenizer and its chat template, so
    torch and mlx see identical prompt and response ids."""

    model_path: Path

    def _load_tokenizer(self) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.stop_ids = self._stop_ids()
        self.think_ids = self._token_ids(THINK_TOKENS)

    def _token_ids(self, tokens: Sequence[str]) -> set[int]:
        """Ids of those of `tokens` the vocabulary has as single tokens."""
        ids = set()
        for tok in tokens:
            tid = self.tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                ids.add(tid)
        return ids

    def banned_ids(self, config: SamplingConfig) -> list[int]:
        """Token ids never sampled under `config`: the think tokens unless thinking is on."""
        return [] if config.enable_thinking else sorted(self.think_ids)

    @property
    def context_length(self) -> int | None:
        """The model's context in tokens (config.json `max_position_embeddings`), if it says."""
        import json

        config = Path(self.model_path) / "config.json"
        value = json.loads(config.read_text()).get("max_position_embeddings") if config.exists() else None
        return int(value) if value else None

    def _stop_ids(self) -> set[int]:
        """End-of-turn ids: the tokenizer's eos, ChatML's end tokens, and generation_config's eos."""
        import json

        ids = {self.tokenizer.eos_token_id} | self._token_ids(("<|im_end|>", "<|endoftext|>"))
        gen_config = Path(self.model_path) / "generation_config.json"
        gen_eos = json.loads(gen_config.read_text()).get("eos_token_id") if gen_config.exists() else None
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return {i for i in ids if i is not None}

    def prompt_ids(self, messages: Messages, enable_thinking: bool = False) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, enable_thinking=enable_thinking
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def text_ids(self, text: str) -> list[int]:
        """Token ids of plain text (no template, no special tokens)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def encode_response(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
