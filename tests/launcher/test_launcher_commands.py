"""Child command lines (docs/processes.md): only values the user set are forwarded."""

from pathlib import Path

import pytest

from launcher.commands import (Executables, child_environment, redact_secrets, router_command,
                               shard_command)
from launcher.settings import UsageError, parse_settings
from launcher.topology import resolve_num_shard, visible_gpu_count

EXE = Executables(router=("textgen-router",), shard=("textgen-shard",))
MODEL = Path("/models/smol")


def settings(*argv, **env):
    return parse_settings(list(argv), env)


def test_router_command_with_defaults_passes_only_required_flags():
    assert router_command(EXE, settings(), MODEL, 1) == [
        "textgen-router", "--model-id", "HuggingFaceTB/SmolLM2-135M-Instruct",
        "--model-path", "/models/smol", "--shard-uds-path", "/tmp/text-generation-server",
        "--num-shard", "1", "--hostname", "0.0.0.0", "--port", "3000"]


def test_prefill_pacing_reaches_the_router_as_given():
    assert "--prefill-pacing-slack" not in router_command(EXE, settings(), MODEL, 1)
    paced = router_command(EXE, settings("--prefill-pacing-slack", "0.25", PREFILL_PACING_PATIENCE_MS="80"), MODEL, 1)
    assert _pairs(paced) >= {("--prefill-pacing-slack", "0.25"), ("--prefill-pacing-patience-ms", "80")}
    off = router_command(EXE, settings("--prefill-pacing-slack", "off"), MODEL, 1)
    assert ("--prefill-pacing-slack", "off") in _pairs(off)


def test_shard_command_with_defaults_passes_only_required_flags():
    assert shard_command(EXE, settings(), MODEL, 1, 2) == [
        "textgen-shard", "serve", "--model-path", "/models/smol",
        "--uds-path", "/tmp/text-generation-server", "--rank", "1", "--world-size", "2"]


def test_set_values_go_to_the_child_that_uses_them():
    s = settings("--max-batch-prefill-tokens", "512", "--dtype", "bfloat16",
                 "--kv-cache-tokens", "4096", "--json-output", "--otlp-endpoint", "http://c:4317",
                 "--master-port", "29600", "--cuda-memory-fraction", "0.9",
                 "--kv-cache-dtype", "fp8_e4m3fn", "--quantize", "fp8", MAX_CONCURRENT_REQUESTS="16")
    router = router_command(EXE, s, MODEL, 1)
    shard = shard_command(EXE, s, MODEL, 0, 1)
    assert _pairs(router) >= {("--max-concurrent-requests", "16"),
                              ("--max-batch-prefill-tokens", "512"),
                              ("--otlp-endpoint", "http://c:4317")}
    assert "--json-output" in router and "--json-output" in shard
    assert _pairs(shard) >= {("--dtype", "bfloat16"), ("--kv-cache-tokens", "4096"),
                             ("--master-port", "29600"), ("--cuda-memory-fraction", "0.9"),
                             ("--kv-cache-dtype", "fp8_e4m3fn"), ("--quantize", "fp8")}
    assert "--dtype" not in router and "--kv-cache-dtype" not in router and "--quantize" not in router and "--max-batch-prefill-tokens" not in shard


def _pairs(argv):
    return set(zip(argv, argv[1:]))


def test_false_switch_is_not_forwarded():
    s = settings(JSON_OUTPUT="false")
    assert "--json-output" not in router_command(EXE, s, MODEL, 1)


def test_prefix_caching_and_policy_are_forwarded_as_set():
    assert "--prefix-caching" not in router_command(EXE, settings(), MODEL, 1)
    off = router_command(EXE, settings(PREFIX_CACHING="false"), MODEL, 1)
    assert ("--prefix-caching", "false") in _pairs(off)
    on = router_command(EXE, settings("--prefix-caching", "true", "--scheduling-policy", "fifo",
                                      "--scheduling-age-cap-ms", "0"), MODEL, 1)
    assert _pairs(on) >= {("--prefix-caching", "true"), ("--scheduling-policy", "fifo"),
                          ("--scheduling-age-cap-ms", "0")}
    assert "--prefix-caching" not in shard_command(EXE, settings(PREFIX_CACHING="1"), MODEL, 0, 1)
    with pytest.raises(UsageError, match="PREFIX_CACHING"):
        settings(PREFIX_CACHING="sometimes")
    with pytest.raises(UsageError, match="scheduling-policy"):
        settings("--scheduling-policy", "random")


def test_legacy_input_length_is_forwarded_under_the_new_name():
    router = router_command(EXE, settings("--max-input-length", "300"), MODEL, 1)
    assert ("--max-input-tokens", "300") in _pairs(router)
    assert "--max-input-length" not in router


def test_child_environment_drops_the_launchers_env_twins():
    s = settings("--otlp-service-name", "my-llm")
    env = child_environment(s, {"MAX_TOTAL_TOKENS": "9", "PORT": "80", "PATH": "/bin",
                                "HF_TOKEN": "t"})
    assert env == {"PATH": "/bin", "HF_TOKEN": "t", "OTEL_SERVICE_NAME": "my-llm"}


def test_api_key_is_redacted_in_logs():
    argv = router_command(EXE, settings("--api-key", "s3cret"), MODEL, 1)
    assert ("--api-key", "s3cret") in _pairs(argv)
    assert "s3cret" not in " ".join(redact_secrets(argv))


@pytest.mark.parametrize("argv,gpus,expected", [
    ([], 0, 1), ([], 4, 4), (["--num-shard", "2"], 8, 2), (["--sharded", "false"], 4, 1),
    (["--sharded", "true"], 4, 4), (["--sharded", "true", "--num-shard", "3"], 0, 3),
    (["--device", "cpu"], 4, 1),
])
def test_num_shard_resolution(argv, gpus, expected):
    assert resolve_num_shard(settings(*argv), lambda: gpus) == expected


def test_sharded_needs_several_gpus():
    with pytest.raises(UsageError, match="more than one visible GPU"):
        resolve_num_shard(settings("--sharded"), lambda: 1)
    with pytest.raises(UsageError, match="more than one shard"):
        settings("--sharded", "--num-shard", "1")


def test_visible_gpu_count_reads_the_given_environment():
    never = lambda: pytest.fail("queried nvidia-smi")  # noqa: E731
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,3"}, never) == 3
    assert visible_gpu_count({"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, never) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}, never) == 0
    assert visible_gpu_count({"NVIDIA_VISIBLE_DEVICES": "all"}, lambda: 8) == 8


def test_watermark_flags_reach_the_router_and_are_range_checked():
    command = router_command(EXE, settings("--watermark-gamma", "0.25", WATERMARK_DELTA="3"), MODEL, 1)
    assert command[command.index("--watermark-gamma") + 1] == "0.25"
    assert float(command[command.index("--watermark-delta") + 1]) == 3.0
    for argv in (["--watermark-gamma", "1"], ["--watermark-gamma", "0"], ["--watermark-delta", "-1"]):
        with pytest.raises(UsageError, match="watermark"):
            settings(*argv)


def test_grammar_flags_reach_the_router_as_set():
    command = router_command(
        EXE, settings("--disable-grammar-support", "--max-grammar-bytes", "5000", GRAMMAR_COMPILE_TIMEOUT_MS="250"),
        MODEL, 1,
    )
    assert "--disable-grammar-support" in command
    assert command[command.index("--max-grammar-bytes") + 1] == "5000"
    assert command[command.index("--grammar-compile-timeout-ms") + 1] == "250"
    plain = router_command(EXE, settings(), MODEL, 1)
    assert not any("grammar" in arg for arg in plain)
    with pytest.raises(UsageError, match="max-grammar-bytes"):
        settings("--max-grammar-bytes", "0")


def test_speculate_and_its_vllm_name_reach_the_router_only():
    assert "--speculate" not in router_command(EXE, settings(), MODEL, 1)
    for argv in (("--speculate", "4"), ("--num-speculative-tokens", "4")):
        assert ("--speculate", "4") in _pairs(router_command(EXE, settings(*argv), MODEL, 1))
    assert ("--speculate", "3") in _pairs(router_command(EXE, settings(SPECULATE="3"), MODEL, 1))
    assert "--speculate" not in shard_command(EXE, settings("--speculate", "4"), MODEL, 0, 1)
    with pytest.raises(UsageError, match="speculate"):
        settings("--speculate", "-1")


def test_speculative_model_reaches_every_shard_as_its_resolved_directory():
    s = settings("--speculate", "4", "--speculative-model", "org/draft")
    draft = Path("/cache/models--org--draft/snapshots/abc")
    for rank in range(2):
        shard = shard_command(EXE, s, MODEL, rank, 2, draft)
        assert ("--speculative-model", str(draft)) in _pairs(shard)
        assert shard.count("--speculative-model") == 1 and "org/draft" not in shard
    router = router_command(EXE, s, MODEL, 2)
    assert "--speculative-model" not in router and "org/draft" not in router
    assert ("--speculate", "4") in _pairs(router)
    assert "--speculative-model" not in shard_command(EXE, settings("--speculate", "4"), MODEL, 0, 1)


def test_speculative_model_env_twin_does_not_reach_the_children():
    s = settings(SPECULATE="2", SPECULATIVE_MODEL="org/draft")
    assert "SPECULATIVE_MODEL" not in child_environment(s, {"SPECULATIVE_MODEL": "org/draft", "PATH": "/bin"})
