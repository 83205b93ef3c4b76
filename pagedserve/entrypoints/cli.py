"""The `pagedserve` command. Each subcommand registers its parser and handler in SUBCOMMANDS, so
`bench` and `plan` can join `serve` without touching the rest."""

import argparse
import sys
from collections.abc import Callable

from pagedserve import __version__
from pagedserve.entrypoints.model_tag import take_model_tag
from pagedserve.entrypoints.plan import add_plan_args, run_plan
from pagedserve.errors import ConfigError

# name -> function that adds the subcommand's parser and sets `handler` (Namespace -> exit status).
SubcommandInit = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _init_serve(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from pagedserve.entrypoints.openai.cli_args import make_arg_parser

    parser = subparsers.add_parser(
        "serve",
        help="Start the OpenAI-compatible server.",
        description="Start the OpenAI-compatible server (the same flags as "
        "`python -m pagedserve.entrypoints.openai.api_server`, vLLM's names).",
    )
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        help="The model to serve (like --model). Default: the embedded SmolLM2-135M-Instruct.",
    )
    make_arg_parser(parser)
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from pagedserve.entrypoints.openai.api_server import run

    take_model_tag(args)
    return run(args)


def _init_plan(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "plan",
        help="Plan the KV-cache budget of a model and workload (no weights loaded).",
        description="Weights, KV bytes per token, blocks, capacity and the concurrency that fits, with the "
        "engine's own arithmetic; the flags to serve the workload with, or what would fit. "
        "Exit status 1 when it does not fit.",
    )
    add_plan_args(parser)
    parser.set_defaults(handler=run_plan)


SUBCOMMANDS: dict[str, SubcommandInit] = {"serve": _init_serve, "plan": _init_plan}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pagedserve",
        description="LLM inference and serving with a paged KV cache and continuous batching.",
    )
    parser.add_argument("--version", action="version", version=f"pagedserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for init in SUBCOMMANDS.values():
        init(subparsers)
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)  # the subcommand's exit status
        return status
    except ConfigError as exc:
        parser.exit(2, f"pagedserve: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
