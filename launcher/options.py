"""The launcher's flags: one table naming each flag, its env twin, its type and where it goes.

Flags keep TGI's names. Each has an env twin in SCREAMING_SNAKE_CASE (`--max-input-tokens` ⇔
`MAX_INPUT_TOKENS`); the command line wins over the environment. A flag forwarded to a child
has no launcher default: it travels only when the user set it, and the child's own default
(named in `--help`) applies otherwise.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

ROUTER = "router"
SHARD = "shard"

DEMO_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_TRUE = {"true", "1"}
_FALSE = {"false", "0"}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true/false/1/0, got {text!r}")


def _number(convert: Callable[[str], Any], check: Callable[[Any], bool], what: str):
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in its error messages
    return parse


positive_int = _number(int, lambda v: v > 0, "a positive integer")
non_negative_int = _number(int, lambda v: v >= 0, "a non-negative integer")
port_number = _number(int, lambda v: 0 < v < 65536, "a port number (1-65535)")
fraction = _number(float, lambda v: 0.0 < v <= 1.0, "a number in (0, 1]")
positive_seconds = _number(float, lambda v: v > 0, "a positive number of seconds")
open_fraction = _number(float, lambda v: 0.0 < v < 1.0, "a number in (0, 1)")
positive_number = _number(float, lambda v: 0 < v < float("inf"), "a positive number")


_non_negative_number = _number(float, lambda v: 0 <= v < float("inf"), "`off` or a number >= 0")


def off_or_non_negative(text: str) -> str | float:
    """`off`, or a number >= 0 (the router's --prefill-pacing-slack)."""
    return "off" if text.strip() == "off" else _non_negative_number(text)


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value")
    return text


@dataclass(frozen=True)
class Option:
    """One supported flag. `forward` names the children that receive it when set."""

    flags: tuple[str, ...]
    help: str
    parse: Callable[[str], Any] = non_empty
    forward: tuple[str, ...] = ()
    child_default: str | None = None
    default: Any = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    extra_envs: tuple[str, ...] = ()

    @property
    def long_flag(self) -> str:
        return next(flag for flag in self.flags if flag.startswith("--"))

    @property
    def dest(self) -> str:
        return self.long_flag[2:].replace("-", "_")

    @property
    def envs(self) -> tuple[str, ...]:
        return (self.dest.upper(), *self.extra_envs)


def _router(flag: str, help: str, parse=positive_int, default: str | None = None) -> Option:
    return Option((flag,), help, parse, forward=(ROUTER,), child_default=default)


def _shard(flag: str, help: str, parse=non_empty, default: str | None = None,
           choices: tuple[str, ...] | None = None) -> Option:
    return Option((flag,), help, parse, forward=(SHARD,), child_default=default, choices=choices)


OPTIONS: tuple[Option, ...] = (
    # Model selection (used by the launcher itself).
    Option(("--model-id",), "Hub model id or local model directory.", default=DEMO_MODEL_ID),
    Option(("--revision",), "Hub revision: branch, tag, commit or refs/pr/N."),
    Option(("--huggingface-hub-cache",), "Hugging Face cache directory "
           "(default: huggingface_hub's, from HF_HUB_CACHE / HF_HOME)."),
    # Topology.
    Option(("--num-shard",), "Number of shards (one per GPU).", positive_int),
    Option(("--sharded",), "Shard the model over every visible GPU (true/false).", parse_bool),
    Option(("--shard-uds-path",), "Shard i listens on the unix socket {path}-{i}.",
           default="/tmp/text-generation-server"),
    Option(("--master-addr",), "torch.distributed rendezvous address.",
           forward=(SHARD,), child_default="localhost"),
    Option(("--master-port",), "torch.distributed rendezvous port.", port_number,
           forward=(SHARD,), child_default="29500"),
    # Shard execution.
    _shard("--dtype", "Weights and activations dtype.",
           choices=("float32", "bfloat16", "float16"), default="the model's, bf16 on GPU"),
    _shard("--device", "Device the shards run on.", choices=("cpu", "cuda"),
           default="cuda when available, else cpu"),
    _shard("--attention", "Attention backend: reference or triton.", choices=("reference", "triton"),
           default="triton on CUDA, else reference"),
    _shard("--cuda-graphs", "Decode batch sizes replayed from CUDA graphs, comma-separated; 0 disables.",
           default="1,2,4,8,16,24,32,48,64,96,128,160,192,224,256,320,384,512"),
    _shard("--cuda-graph-tokens", "Token counts of the CUDA graphs for steps with prompt chunks or "
           "verified drafts beside decodes, comma-separated; 0 disables.", default="8,16,32,64,128,192,256,320,384,512,640,768,896,1024"),
    _shard("--kv-cache-dtype", "Store the KV cache in fp8: half the memory per token of bf16.",
           choices=("fp8_e4m3fn", "fp8_e5m2"), default="the model's dtype"),
    _shard("--quantize", "Quantize the linear weights at load: fp8 (e4m3, a scale per output feature; "
           "half the weight memory of bf16; GPUs with fp8 tensor cores, sm_89+); gptq, awq, marlin: the "
           "checkpoint's own GPTQ/AWQ weights (loaded without the flag too).", choices=("fp8", "gptq", "awq", "marlin"),
           default="none"),
    _shard("--kv-cache-tokens", "KV pool size in tokens on CPU.", positive_int,
           default="32768"),
    _shard("--cuda-memory-fraction", "Share of GPU memory the shard may use.", fraction,
           default="1.0"),
    # Router limits.
    _router("--max-concurrent-requests", "Requests served at once; more get 429.", default="1024"),
    _router("--max-best-of", "Largest best_of a request may ask for.", default="2"),
    _router("--max-stop-sequences", "Most stop sequences per request.", non_negative_int, "4"),
    _router("--max-top-n-tokens", "Largest top_n_tokens per request.", non_negative_int, "5"),
    _router("--max-input-tokens", "Longest prompt in tokens.", default="max_total_tokens - 1"),
    Option(("--max-input-length",), "Legacy name of --max-input-tokens.", positive_int),
    _router("--max-total-tokens", "Longest prompt plus generation in tokens.",
            default="min(KV pool, max_position_embeddings)"),
    _router("--max-batch-prefill-tokens", "Token budget of one step.", default="4096"),
    _router("--max-batch-total-tokens", "Cap on the KV pool used, in tokens.",
            default="the whole pool measured at warmup"),
    _router("--max-batch-size", "Most sequences in one step.", default="unlimited"),
    _router("--step-timeout", "Seconds a step may take, plus 4x its tokens at warmup's measured "
            "rate, before the router counts a shard as hung, fails the in-flight requests and turns "
            "/health to 503 (textgen only).",
            default="60"),
    Option(("--prefix-caching",), "Reuse the KV of cached prompt and generated prefixes "
           "(radix prefix cache), true/false.", parse_bool, forward=(ROUTER,),
           child_default="true"),
    Option(("--generation-config-defaults",), "Apply the model's generation_config.json "
           "sampling values to OpenAI requests that leave them unset, true/false "
           "(textgen only).", parse_bool, forward=(ROUTER,), child_default="true"),
    Option(("--scheduling-policy",), "Admission order: longest cached prefix first (with "
           "an age cap) or first come, first served.", forward=(ROUTER,),
           child_default="longest-prefix", choices=("longest-prefix", "fifo")),
    _router("--scheduling-age-cap-ms", "Milliseconds after which a waiting request goes "
            "ahead of requests with a longer cached prefix.", non_negative_int, "2000"),
    Option(("--speculate", "--num-speculative-tokens"), "Speculative decoding: each decode drafts up "
           "to N tokens by prompt lookup (n-gram), or with --speculative-model, and verifies them in "
           "the same forward pass; the text is the same as without. 0: off.", non_negative_int,
           forward=(ROUTER,), child_default="0"),
    # Used by the launcher itself: resolved like --model-id, checked, then given to every shard
    # as `--speculative-model DIR` (commands.shard_command).
    Option(("--speculative-model",), "Hub model id or local directory of a small draft model that "
           "shares the model's tokenizer; each decode's drafts come from it instead of prompt "
           "lookup. Needs --speculate N (--num-speculative-tokens) >= 1."),
    _router("--prefill-pacing-slack", "Prefill pacing: while streams are decoding, a step takes only the "
            "prompt tokens that keep its expected time (learned from the steps run) within this "
            "fraction of its decodes' own; `off`: each step may take the whole "
            "--max-batch-prefill-tokens (textgen only).", off_or_non_negative, "off"),
    _router("--prefill-pacing-patience-ms", "Milliseconds a request may wait for its first token "
            "before pacing yields and a step takes the whole budget again (textgen only).",
            non_negative_int, "50"),
    _router("--max-stream-backlog", "Events a stream may fall behind its reader before it is "
            "dropped with an error, its sequence cancelled (textgen only).", default="1024"),
    _router("--payload-limit", "Largest request body in bytes (413 above).", default="2000000"),
    _router("--header-read-timeout", "Seconds a client may take to send a request's headers; "
            "also bounds the wait for the next request on a kept-alive connection (textgen only).",
            positive_seconds, "30"),
    _router("--body-read-timeout", "Seconds a client may take to send a request's body after its "
            "headers; past it, 408 (textgen only).", positive_seconds, "30"),
    _router("--keep-alive-timeout", "Seconds a connection may stay open with no request in flight "
            "and no byte moving; a streaming response is in flight (textgen only).",
            positive_seconds, "15"),
    _router("--max-connections", "Most client connections open at once; more are closed at once, "
            "loopback clients get 8 more; also the listen backlog (textgen only).", default="1024"),
    _router("--validation-workers", "Threads that may tokenize or compile grammars at once.",
            default="2"),
    Option(("--disable-grammar-support",), "Refuse every request with a grammar, schema or "
           "tools constraint (422 native, 400 OpenAI).", forward=(ROUTER,), switch=True),
    Option(("--allow-special-tokens-in-content",), "Tokenize special-token strings in chat "
           "messages as special tokens; off, message text is text (textgen only).",
           forward=(ROUTER,), switch=True),
    _router("--max-grammar-bytes", "Largest grammar (schema, regex, Lark, choices) a request "
            "may send, in bytes (textgen only).", default="1000000"),
    _router("--grammar-compile-timeout-ms", "Milliseconds the router may spend compiling one "
            "grammar before refusing the request (textgen only).", default="1000"),
    _router("--watermark-gamma", "Watermark: share of tokens that are green after each token.",
            open_fraction, "0.5"),
    _router("--watermark-delta", "Watermark: bias added to green tokens' logits.",
            positive_number, "2.0"),
    _router("--api-key", "Bearer token required on generation routes.", non_empty,
            default="none"),
    _router("--cors-allow-origin", "Allowed CORS origins, comma separated; none: CORS is off.", non_empty,
            default="none"),
    # HTTP listener: the launcher probes it for readiness, so it always passes both.
    Option(("--hostname",), "Address the router listens on.", default="0.0.0.0"),
    Option(("-p", "--port"), "Port the router listens on.", port_number, default=3000),
    # Observability.
    Option(("--json-output",), "Log JSON lines.", forward=(ROUTER, SHARD), switch=True),
    Option(("--otlp-endpoint",), "OpenTelemetry collector endpoint.", forward=(ROUTER, SHARD)),
    Option(("--otlp-service-name",), "OpenTelemetry service name "
           "(given to the children as OTEL_SERVICE_NAME)."),
    # Lifecycle.
    Option(("-g", "--graceful-termination-timeout", "--shutdown-timeout"),
           "Seconds the router may take to finish in-flight requests on SIGTERM.",
           positive_seconds, default=90.0, extra_envs=("SHUTDOWN_TIMEOUT",)),
    Option(("--usage-stats",), "Accepted for TGI compatibility; textgen never sends usage "
           "statistics, whatever the value.", choices=("on", "off", "no-stack")),
    Option(("--startup-timeout",), "Seconds to wait for the shards and router to be ready.",
           positive_seconds, default=1800.0),
)

OPTIONS_BY_DEST = {option.dest: option for option in OPTIONS}


@dataclass(frozen=True)
class Unsupported:
    """A TGI flag textgen does not implement: setting it (or its env twin) is an error."""

    flag: str
    reason: str
    takes_value: bool = True
    has_env: bool = True

    @property
    def dest(self) -> str:
        return "unsupported_" + self.flag[2:].replace("-", "_")

    @property
    def env(self) -> str | None:
        return self.flag[2:].replace("-", "_").upper() if self.has_env else None


_NOT_YET = "not implemented in textgen yet"
UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported("--lora-adapters", "LoRA adapters are " + _NOT_YET),
    Unsupported("--trust-remote-code", "textgen runs only its own model code", False),
    Unsupported("--rope-scaling", "rope scaling overrides are " + _NOT_YET),
    Unsupported("--rope-factor", "rope scaling overrides are " + _NOT_YET),
    Unsupported("--prometheus-port", "metrics are served on the main port at /metrics"),
    Unsupported("--max-waiting-tokens", "textgen always uses chunked prefill"),
    Unsupported("--waiting-served-ratio", "textgen always uses chunked prefill"),
    Unsupported("--weights-cache-override", _NOT_YET),
    Unsupported("--disable-custom-kernels", "use --attention reference instead", False),
    Unsupported("--tokenizer-config-path", _NOT_YET),
    Unsupported("--max-client-batch-size", _NOT_YET),
    Unsupported("--enable-prefill-logprobs", _NOT_YET, False),
    Unsupported("--ngrok", "ngrok tunnels are not supported", False),
    Unsupported("--ngrok-authtoken", "ngrok tunnels are not supported"),
    Unsupported("--ngrok-edge", "ngrok tunnels are not supported"),
    # TGI's `-e/--env` would have the env twin ENV, a name containers set for other reasons.
    Unsupported("--env", "print the environment with `pip list` and `nvidia-smi`", False,
                has_env=False),
)
