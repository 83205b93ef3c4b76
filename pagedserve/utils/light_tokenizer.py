"""The API server's tokenizer: the `tokenizers` library directly, plus the chat template through jinja2,
so that the server's process never imports transformers (~60 MB and seconds of import).

The settings process (config/frontend_config.py), which loads transformers anyway to resolve the config,
loads the model's tokenizer as the engine does (a folder's tokenizer.json and tokenizer_config.json, a
GGUF file's vocabulary through its converted folder, a slow tokenizer converted) and takes a
`TokenizerSnapshot` of it: the backend as transformers built it (its added tokens and the post-processor
that adds BOS included), the special tokens and the chat template. `LightTokenizer` answers what the
frontend asks of a tokenizer with the same results as transformers' fast tokenizer
(tests/entrypoints/test_light_frontend.py compares them)."""

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tokenizers import Encoding, Tokenizer

from pagedserve.utils.chat_template import render_chat_template
from pagedserve.utils.user_json import JsonValue

# transformers' clean_up_tokenization (for WordPiece tokenizers: BERT's " ." etc.)
_CLEAN_UPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


@dataclass(frozen=True)
class TokenizerSnapshot:
    """What the frontend needs of a transformers fast tokenizer, in plain values (pickled across
    processes)."""

    backend_json: str  # the `tokenizers` Tokenizer, serialized, without padding or truncation
    # transformers' special_tokens_map: bos_token, eos_token, ... (templates read them); lists for the
    # additional special tokens
    special_tokens: dict[str, JsonValue]
    bos_token_id: int | None
    eos_token_id: int | None
    all_special_ids: tuple[int, ...]
    chat_template: str | dict[str, str] | None  # a dict: named templates ("default", "tool_use", ...)
    clean_up_spaces: bool  # decode applies the WordPiece clean-up (never for BPE, as transformers)
    token_types: bool  # the model reads token_type_ids (a pair's second segment)


def backend_json(backend: Tokenizer) -> str:
    """The backend serialized without padding or truncation (set on a copy: the caller's is untouched)."""
    plain = copy.copy(backend)
    plain.no_padding()
    plain.no_truncation()
    return plain.to_str()


class LightTokenizer:
    """transformers' fast tokenizer, for what the frontend calls: encode, decode, a pair's encoding,
    token strings, the chat template, the special ids; `backend_tokenizer` for streaming detokenization
    and structured outputs."""

    is_fast = True

    def __init__(self, snapshot: TokenizerSnapshot) -> None:
        self.backend_tokenizer = Tokenizer.from_str(snapshot.backend_json)
        self.special_tokens_map = snapshot.special_tokens
        self.bos_token_id = snapshot.bos_token_id
        self.eos_token_id = snapshot.eos_token_id
        self.all_special_ids = list(snapshot.all_special_ids)
        self.chat_template = snapshot.chat_template
        self._snapshot = snapshot

    def encode(
        self,
        text: str,
        add_special_tokens: bool = True,
        truncation: bool = False,
        max_length: int | None = None,
    ) -> list[int]:
        """`text`'s ids; with `truncation`, at most `max_length` including the special tokens added (cut
        on the right, the special tokens kept, as transformers cuts)."""
        if not truncation or max_length is None:
            return list(self._encode(text, None, add_special_tokens).ids)
        encoding = self._encode(text, None, False)
        room = max_length - (
            self.backend_tokenizer.num_special_tokens_to_add(False) if add_special_tokens else 0
        )
        encoding.truncate(max(room, 0))
        if add_special_tokens:
            encoding = self.backend_tokenizer.post_process(encoding, add_special_tokens=True)
        return list(encoding.ids)

    def _encode(self, text: str, text_pair: str | None, add_special_tokens: bool) -> Encoding:
        # NOTE: encode_batch releases the GIL while Rust tokenizes (encode holds it: a 5 MB prompt stalled
        # the server's event loop, /health included, for ~4 s), as transformers' fast tokenizers call it.
        (encoding,) = self.backend_tokenizer.encode_batch(
            [text if text_pair is None else (text, text_pair)], add_special_tokens=add_special_tokens
        )
        return encoding

    def __call__(self, text: str, text_pair: str | None = None) -> dict[str, list[int]]:
        """A text's or a pair's encoding: `input_ids`, `attention_mask`, and `token_type_ids` where the
        model reads them."""
        encoding = self._encode(text, text_pair, True)
        encoded = {"input_ids": list(encoding.ids), "attention_mask": list(encoding.attention_mask)}
        if self._snapshot.token_types:
            encoded["token_type_ids"] = list(encoding.type_ids)
        return encoded

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        text = self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if self._snapshot.clean_up_spaces:
            for spaced, joined in _CLEAN_UPS:
                text = text.replace(spaced, joined)
        return text

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """The token string of an id, or of each. Raises ValueError for an id out of the vocabulary
        (transformers answers None)."""
        if isinstance(ids, int):
            return self._token(ids)
        return [self._token(int(i)) for i in ids]

    def _token(self, token_id: int) -> str:
        token: str | None = self.backend_tokenizer.id_to_token(token_id)
        if token is None:
            raise ValueError(
                f"Token id {token_id} is not in the tokenizer's vocabulary of "
                f"{self.backend_tokenizer.get_vocab_size()} tokens."
            )
        return token

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, JsonValue]],
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, JsonValue]] | None = None,
        documents: Sequence[Mapping[str, JsonValue]] | None = None,
        tokenize: bool = True,
        return_dict: bool = False,
        **template_kwargs: JsonValue,
    ) -> str | list[int]:
        """The conversation rendered by `chat_template` (else the tokenizer's), and tokenized without
        adding special tokens (the template writes them). `return_dict` is accepted for transformers'
        signature; the ids come back as a list. Raises ValueError or jinja2's TemplateError."""
        rendered = render_chat_template(
            self._template(chat_template, tools),
            conversation,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            variables={**self.special_tokens_map, **template_kwargs},
        )
        return self.encode(rendered, add_special_tokens=False) if tokenize else rendered

    def _template(self, chat_template: str | None, tools: object) -> str:
        """transformers' choice: the given template (or a name of the tokenizer's), else the tokenizer's,
        "tool_use" of its named ones when tools are given, else "default"."""
        own = self.chat_template
        if isinstance(own, dict):
            if chat_template is not None:
                return own.get(chat_template, chat_template)
            name = "tool_use" if tools is not None and "tool_use" in own else "default"
            if name not in own:
                raise ValueError(
                    f"The tokenizer has named chat templates ({', '.join(sorted(own))}) and none is 'default': "
                    "pass one with --chat-template."
                )
            return own[name]
        template = chat_template or own
        if template is None:
            raise ValueError("The tokenizer has no chat template: pass one with --chat-template.")
        return template
