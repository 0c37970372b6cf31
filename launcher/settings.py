"""Parse the command line and the environment into one typed, validated `Settings`.

The environment is read only here, inside `parse_settings`, from the mapping it is given.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from .options import OPTIONS, UNSUPPORTED, Option, parse_bool


class UsageError(ValueError):
    """The flags or env twins are invalid; the message says which and why."""


@dataclass(frozen=True)
class Settings:
    """Every launcher setting. None means "not set": the child's own default applies."""

    model_id: str
    revision: str | None
    huggingface_hub_cache: str | None
    num_shard: int | None
    sharded: bool | None
    shard_uds_path: str
    master_addr: str | None
    master_port: int | None
    dtype: str | None
    device: str | None
    attention: str | None
    cuda_graphs: str | None
    cuda_graph_tokens: str | None
    kv_cache_dtype: str | None
    quantize: str | None
    kv_cache_tokens: int | None
    cuda_memory_fraction: float | None
    max_concurrent_requests: int | None
    max_best_of: int | None
    max_stop_sequences: int | None
    max_top_n_tokens: int | None
    max_input_tokens: int | None
    max_total_tokens: int | None
    max_batch_prefill_tokens: int | None
    max_batch_total_tokens: int | None
    max_batch_size: int | None
    step_timeout: int | None
    prefix_caching: bool | None
    speculate: int | None
    speculative_model: str | None
    generation_config_defaults: bool | None
    scheduling_policy: str | None
    scheduling_age_cap_ms: int | None
    prefill_pacing_slack: str | float | None
    prefill_pacing_patience_ms: int | None
    max_stream_backlog: int | None
    payload_limit: int | None
    header_read_timeout: float | None
    body_read_timeout: float | None
    keep_alive_timeout: float | None
    max_connections: int | None
    validation_workers: int | None
    disable_grammar_support: bool | None
    allow_special_tokens_in_content: bool | None
    max_grammar_bytes: int | None
    grammar_compile_timeout_ms: int | None
    watermark_gamma: float | None
    watermark_delta: float | None
    api_key: str | None
    cors_allow_origin: str | None
    hostname: str
    port: int
    json_output: bool | None
    otlp_endpoint: str | None
    otlp_service_name: str | None
    graceful_termination_timeout: float
    usage_stats: str | None
    startup_timeout: float


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of exiting so callers decide
        raise UsageError(message)


def _help(option: Option) -> str:
    envs = ", ".join(option.envs)
    if option.default is not None:
        return f"{option.help} [default: {option.default}] [env: {envs}]"
    if option.child_default is not None:
        owner = " and ".join(option.forward)
        return f"{option.help} [{owner} default: {option.child_default}] [env: {envs}]"
    return f"{option.help} [env: {envs}]"


def build_parser(prog: str = "textgen-launcher") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Serve a Hugging Face model with textgen: resolves the model, starts one "
                    "shard per GPU and the router, and supervises them. Every flag can also "
                    "be set through the environment variable shown as [env: ...].",
        epilog="Subcommand: `download-demo-model [--huggingface-hub-cache DIR]` converts the "
               "offline demo model into the Hugging Face cache.")
    for option in OPTIONS:
        if option.switch:
            parser.add_argument(*option.flags, dest=option.dest, action="store_const",
                                const=True, default=None, help=_help(option))
        elif option.parse is parse_bool:
            parser.add_argument(*option.flags, dest=option.dest, nargs="?", const=True,
                                type=parse_bool, default=None, metavar="BOOL",
                                help=_help(option))
        else:
            parser.add_argument(*option.flags, dest=option.dest, type=option.parse,
                                choices=option.choices, default=None, help=_help(option))
    unsupported = parser.add_argument_group(
        "TGI flags textgen does not support (setting one is an error)")
    for flag in UNSUPPORTED:
        if flag.takes_value:
            unsupported.add_argument(flag.flag, dest=flag.dest, default=None, nargs="?",
                                     const=True, metavar="VALUE", help=flag.reason)
        else:
            unsupported.add_argument(flag.flag, dest=flag.dest, default=None,
                                     action="store_const", const=True, help=flag.reason)
    return parser


def _from_environment(option: Option, environ: Mapping[str, str]) -> Any:
    for name in option.envs:
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        parse = parse_bool if option.switch else option.parse
        try:
            value = parse(raw)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"environment variable {name}: {exc}") from None
        if option.choices is not None and value not in option.choices:
            choices = ", ".join(option.choices)
            raise UsageError(f"environment variable {name}: {raw!r} is not one of {choices}")
        return value
    return None


def _reject_unsupported(namespace: argparse.Namespace, environ: Mapping[str, str]) -> None:
    for flag in UNSUPPORTED:
        from_env = flag.env is not None and environ.get(flag.env, "") != ""
        if getattr(namespace, flag.dest) is not None or from_env:
            source = f" (set through environment variable {flag.env})" if from_env else ""
            raise UsageError(
                f"{flag.flag}{source} is not supported by textgen: {flag.reason}")


def _merge_legacy_input_length(values: dict[str, Any]) -> None:
    legacy = values.pop("max_input_length")
    if legacy is None:
        return
    if values["max_input_tokens"] is not None:
        raise UsageError("--max-input-tokens and --max-input-length (its legacy name) are "
                         "both set; set only --max-input-tokens")
    values["max_input_tokens"] = legacy


def _check_consistency(values: dict[str, Any]) -> None:
    inputs, total = values["max_input_tokens"], values["max_total_tokens"]
    if inputs is not None and total is not None and inputs >= total:
        raise UsageError(f"--max-input-tokens ({inputs}) must be less than "
                         f"--max-total-tokens ({total})")
    batch_total = values["max_batch_total_tokens"]
    if total is not None and batch_total is not None and total > batch_total:
        raise UsageError(f"--max-total-tokens ({total}) must not exceed "
                         f"--max-batch-total-tokens ({batch_total})")
    if values["sharded"] is True and values["num_shard"] == 1:
        raise UsageError("--sharded true needs more than one shard, but --num-shard is 1")
    if values["speculative_model"] is not None and not values["speculate"]:
        raise UsageError("--speculative-model needs --num-speculative-tokens N (or --speculate N) "
                         ">= 1: the number of tokens the draft model proposes per decode")


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Command line first, then env twins, then the launcher's own defaults."""
    namespace = build_parser().parse_args(list(argv))
    _reject_unsupported(namespace, environ)
    values: dict[str, Any] = {}
    for option in OPTIONS:
        value = getattr(namespace, option.dest)
        if value is None:
            value = _from_environment(option, environ)
        if value is None:
            value = option.default
        values[option.dest] = value
    _merge_legacy_input_length(values)
    _check_consistency(values)
    known = {field.name for field in fields(Settings)}
    return Settings(**{name: value for name, value in values.items() if name in known})
