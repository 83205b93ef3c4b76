"""The model named as a subcommand's positional argument (`pagedserve serve MODEL`, `pagedserve plan
MODEL`), like vLLM's `serve`: shared by the subcommands, so they need not import the command (cli.py)."""

import argparse

from pagedserve.errors import ConfigError


def take_model_tag(args: argparse.Namespace) -> None:
    """The model given as the positional `model_tag` becomes `args.model` (it may come as --model
    instead, like vLLM's `serve`); two different ones are a ConfigError."""
    if args.model_tag is not None:
        if args.model and args.model != args.model_tag:
            raise ConfigError(f"Two models given: {args.model_tag!r} and --model {args.model!r}; give one.")
        args.model = args.model_tag
