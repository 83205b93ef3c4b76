"""Chat on a harmony model (gpt-oss, `FamilyFacts.harmony_chat`): the prompt rendered by openai-harmony
(harmony_prompt.py), the output ended by harmony's stop tokens and read by channel (harmony_channels.py).
Its parsers are harmony's: another --reasoning-parser or --tool-call-parser would read text the model
never writes, so one is refused at startup."""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pagedserve.config.engine_config import EngineConfig
from pagedserve.entrypoints.chat_utils import normalize_messages
from pagedserve.entrypoints.openai.chat_tools import resolve_chat_tools
from pagedserve.entrypoints.openai.harmony_encoding import harmony_encoding
from pagedserve.entrypoints.openai.harmony_prompt import render_harmony_prompt
from pagedserve.entrypoints.openai.protocol_chat import ChatTemplateRequest
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.families import family
from pagedserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding

REASONING_PARSER = "openai_gptoss"
TOOL_CALL_PARSER = "openai"


@dataclass(frozen=True)
class HarmonyChat:
    encoding: "HarmonyEncoding"

    @classmethod
    def of(cls, config: EngineConfig, tool_call_parser: str | None) -> "HarmonyChat | None":
        """The model's harmony chat, None when it chats through a template. Raises ConfigError for a
        harmony parser on another model, or another parser on a harmony model."""
        facts = family(config.model.architecture)
        harmony = facts is not None and facts.harmony_chat
        reasoning_parser = None if config.reasoning is None else config.reasoning.parser
        for flag, name, ours in (
            ("--reasoning-parser", reasoning_parser, REASONING_PARSER),
            ("--tool-call-parser", tool_call_parser, TOOL_CALL_PARSER),
        ):
            if name is not None and harmony != (name == ours):
                why = (
                    f"{config.model.architecture} writes the harmony format"
                    if harmony
                    else f"{ours!r} reads the harmony format, which only gpt-oss writes"
                )
                raise ConfigError(
                    f"{flag} {name!r} does not fit this model: {why}. Use {flag} {ours!r} "
                    "on gpt-oss, another elsewhere, or none."
                )
        return cls(harmony_encoding()) if harmony else None

    def render(self, request: ChatTemplateRequest) -> list[int]:
        """The request's conversation, tools and reasoning effort as prompt token ids. Raises
        InvalidRequestError, also for a template's field: harmony renders the chat, no template."""
        for field, value in (
            ("continue_final_message", request.continue_final_message),
            ("documents", request.documents),
            ("chat_template_kwargs", request.chat_template_kwargs),
        ):
            if value:
                raise InvalidRequestError(
                    f"{field} is a chat template's field; this model's chats are rendered in the harmony "
                    "format, which has none: drop it.",
                    param=field,
                )
        sent = request.messages or ()
        return render_harmony_prompt(
            normalize_messages([m.model_dump() for m in sent]),
            [m.reasoning or m.reasoning_content for m in sent],
            resolve_chat_tools(request.tools, "none", None).functions,
            _descriptions(request),
            request.reasoning_effort,
            request.add_generation_prompt,
        )

    def with_stop_tokens(self, params: SamplingParams) -> SamplingParams:
        """`params` also ending at <|return|> and <|call|> (the end of an answer, of a tool call)."""
        stops = self.encoding.stop_tokens_for_assistant_actions()
        return replace(params, stop_token_ids=[*(params.stop_token_ids or ()), *stops])


def _descriptions(request: ChatTemplateRequest) -> dict[str, str]:
    """Each function tool's description (resolve_chat_tools has checked the tools' shape)."""
    functions = [tool["function"] for tool in request.tools or ()]
    return {f["name"]: str(f.get("description") or "") for f in functions}
