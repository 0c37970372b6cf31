"""Flags, env twins, precedence, exclusive and unsupported flags."""

import pytest

from launcher.options import OPTIONS, UNSUPPORTED
from launcher.settings import Settings, UsageError, build_parser, parse_settings


def parse(*argv, **env):
    return parse_settings(list(argv), env)


def test_defaults_without_flags_or_environment():
    settings = parse()
    assert settings.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert settings.hostname == "0.0.0.0" and settings.port == 3000
    assert settings.graceful_termination_timeout == 90.0
    # Child-owned values stay unset so the child's default applies.
    assert settings.max_concurrent_requests is None
    assert settings.dtype is None and settings.json_output is None


def test_every_option_is_a_settings_field():
    names = set(Settings.__dataclass_fields__)
    for option in OPTIONS:
        assert option.dest in names or option.dest == "max_input_length", option.dest


def test_env_twin_sets_value():
    settings = parse(MODEL_ID="/repository", PORT="80", MAX_TOTAL_TOKENS="2048",
                     NUM_SHARD="2", CUDA_MEMORY_FRACTION="0.5", JSON_OUTPUT="true")
    assert settings.model_id == "/repository"
    assert settings.port == 80
    assert settings.max_total_tokens == 2048
    assert settings.num_shard == 2
    assert settings.cuda_memory_fraction == 0.5
    assert settings.json_output is True


def test_command_line_beats_environment():
    settings = parse("--port", "8080", "--max-total-tokens", "100", PORT="80",
                     MAX_TOTAL_TOKENS="2048")
    assert (settings.port, settings.max_total_tokens) == (8080, 100)


def test_short_port_flag():
    assert parse("-p", "9000").port == 9000


@pytest.mark.parametrize("text,expected", [("true", True), ("1", True), ("False", False),
                                           ("0", False)])
def test_boolean_env_twins(text, expected):
    assert parse(SHARDED=text).sharded is expected
    assert parse(JSON_OUTPUT=text).json_output is expected


def test_bad_boolean_env_is_rejected():
    with pytest.raises(UsageError, match="SHARDED.*true/false/1/0"):
        parse(SHARDED="yes please")


def test_sharded_flag_with_and_without_value():
    assert parse("--sharded").sharded is True
    assert parse("--sharded", "false").sharded is False


@pytest.mark.parametrize("argv,message", [
    (["--port", "0"], "port number"),
    (["--port", "http"], "port number"),
    (["--max-batch-size", "-3"], "positive integer"),
    (["--cuda-memory-fraction", "1.5"], r"\(0, 1\]"),
    (["--dtype", "float64"], "invalid choice"),
    (["--kv-cache-dtype", "fp8"], "invalid choice"),
    (["--kv-cache-dtype", "int8"], "invalid choice"),
    (["--quantize", "eetq"], "invalid choice"),
    (["--quantize", "FP8"], "invalid choice"),
    (["--quantize", ""], "non-empty value"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--prefill-pacing-slack", "-0.5"], "`off` or a number >= 0"),
    (["--prefill-pacing-slack", "on"], "`off` or a number >= 0"),
])
def test_invalid_flags_get_clear_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        parse(*argv)


def test_invalid_env_twin_names_the_variable():
    with pytest.raises(UsageError, match="MAX_BATCH_SIZE"):
        parse(MAX_BATCH_SIZE="lots")
    with pytest.raises(UsageError, match="DTYPE.*not one of"):
        parse(DTYPE="float64")
    with pytest.raises(UsageError, match="KV_CACHE_DTYPE.*not one of"):
        parse(KV_CACHE_DTYPE="fp8")
    with pytest.raises(UsageError, match="QUANTIZE.*not one of"):
        parse(QUANTIZE="eetq")  # TGI has it; textgen does not


def test_quantize_from_the_flag_or_its_env_twin():
    assert parse().quantize is None  # bf16/fp16 weights, as the checkpoint has them
    assert parse("--quantize", "fp8").quantize == "fp8"
    assert parse("--quantize", "gptq").quantize == "gptq"  # the checkpoint's own; the shard checks they agree
    assert parse(QUANTIZE="fp8").quantize == "fp8"


def test_kv_cache_dtype_from_the_flag_or_its_env_twin():
    assert parse().kv_cache_dtype is None  # the shard's default: the model dtype
    assert parse("--kv-cache-dtype", "fp8_e4m3fn").kv_cache_dtype == "fp8_e4m3fn"
    assert parse(KV_CACHE_DTYPE="fp8_e5m2").kv_cache_dtype == "fp8_e5m2"
    assert parse("--kv-cache-dtype", "fp8_e4m3fn", KV_CACHE_DTYPE="fp8_e5m2").kv_cache_dtype == "fp8_e4m3fn"


def test_legacy_max_input_length_maps_to_max_input_tokens():
    assert parse("--max-input-length", "100").max_input_tokens == 100
    assert parse(MAX_INPUT_LENGTH="100").max_input_tokens == 100


def test_max_input_tokens_and_legacy_name_are_exclusive():
    with pytest.raises(UsageError, match="both set"):
        parse("--max-input-tokens", "10", "--max-input-length", "10")
    with pytest.raises(UsageError, match="both set"):
        parse("--max-input-tokens", "10", MAX_INPUT_LENGTH="10")


def test_limits_must_be_consistent():
    with pytest.raises(UsageError, match="must be less than"):
        parse("--max-input-tokens", "100", "--max-total-tokens", "100")
    with pytest.raises(UsageError, match="must not exceed"):
        parse("--max-total-tokens", "5000", "--max-batch-total-tokens", "4000")


def test_speculative_model_from_the_flag_or_its_env_twin():
    assert parse().speculative_model is None  # drafts by prompt lookup
    assert parse("--speculate", "4", "--speculative-model", "org/draft").speculative_model == "org/draft"
    env = parse(SPECULATIVE_MODEL="/drafts/small", SPECULATE="2")
    assert (env.speculative_model, env.speculate) == ("/drafts/small", 2)
    both = parse("--num-speculative-tokens", "3", "--speculative-model", "a/b", SPECULATIVE_MODEL="c/d")
    assert (both.speculative_model, both.speculate) == ("a/b", 3)


@pytest.mark.parametrize("argv,env", [
    (["--speculative-model", "org/draft"], {}),
    (["--speculative-model", "org/draft", "--speculate", "0"], {}),
    (["--num-speculative-tokens", "0"], {"SPECULATIVE_MODEL": "org/draft"}),
    ([], {"SPECULATIVE_MODEL": "org/draft"}),
])
def test_speculative_model_needs_speculate(argv, env):
    with pytest.raises(UsageError) as raised:
        parse(*argv, **env)
    assert str(raised.value) == (
        "--speculative-model needs --num-speculative-tokens N (or --speculate N) >= 1: the "
        "number of tokens the draft model proposes per decode")


def test_shutdown_timeout_aliases():
    assert parse("-g", "5").graceful_termination_timeout == 5.0
    assert parse("--shutdown-timeout", "7").graceful_termination_timeout == 7.0
    assert parse(GRACEFUL_TERMINATION_TIMEOUT="3").graceful_termination_timeout == 3.0
    assert parse(SHUTDOWN_TIMEOUT="4").graceful_termination_timeout == 4.0


@pytest.mark.parametrize("flag", [u for u in UNSUPPORTED])
def test_unsupported_flags_fail_clearly(flag):
    argv = [flag.flag, "x"] if flag.takes_value else [flag.flag]
    with pytest.raises(UsageError, match=f"{flag.flag}.* not supported by textgen"):
        parse(*argv)


def test_unsupported_env_twin_fails_too():
    with pytest.raises(UsageError, match="LORA_ADAPTERS.*not supported"):
        parse(LORA_ADAPTERS="a=b")
    assert parse(LORA_ADAPTERS="").model_id  # an empty variable is not a setting


def test_help_names_child_defaults_and_env_twins():
    text = " ".join(build_parser().format_help().split())  # undo line wrapping
    assert "[router default: 1024] [env: MAX_CONCURRENT_REQUESTS]" in text
    assert "[env: PORT]" in text
    assert "Needs --speculate N (--num-speculative-tokens) >= 1. [env: SPECULATIVE_MODEL]" in text
    assert "TGI flags textgen does not support" in text
