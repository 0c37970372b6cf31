"""bench/gpu_speculation.py's pieces on CPU: the time split of the steps that drafted, from the
router's step records; the markdown report of the three servers; the draft server's flags, the
workload subset; the draft model found or written beside the target's tokenizer."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_model, gpu_speculation, step_log  # noqa: E402
from bench.step_log import StepRecord  # noqa: E402


def decode(step, ran_us, draft_us=0, drafted=0, drafts=0, sequences=1):
    """A decode-only step: `drafts` allowed (counted in tokens), `drafted` verified."""
    return StepRecord(step, sequences, sequences, sequences + drafts, ran_us, ran_us - 200, drafts=drafts,
                      drafted=drafted, draft_us=draft_us)  # fmt: skip


def test_the_split_sums_the_drafting_steps_only():
    records = [
        StepRecord(0, 1, 0, 771, 40_000, 39_000),  # the prompt's prefill
        decode(1, 4_500), decode(2, 4_700), decode(3, 4_400),  # plain decodes
        decode(4, 9_000, draft_us=3_000, drafted=4, drafts=4),  # the first draft: catching up on the prompt
        decode(5, 7_000, draft_us=1_000, drafted=4, drafts=4),
        decode(6, 4_600, drafts=4),  # allowed drafts, none proposed (prompt lookup found nothing)
    ]
    split = gpu_speculation.draft_split(records)
    assert split["steps"] == 7 and split["drafting_steps"] == 2 and split["drafted"] == 8
    assert split["draft_s"] == pytest.approx(0.004) and split["verify_and_rest_s"] == pytest.approx(0.012)
    assert split["draft_share"] == pytest.approx(0.25)
    assert split["mean_draft_ms"] == pytest.approx(2.0) and split["mean_verify_and_rest_ms"] == pytest.approx(6.0)
    assert split["plain_decode_median_ms"] == pytest.approx(4.5)  # steps 1-3: no prefill, no drafts allowed


def test_a_step_that_drafted_is_one_with_draft_time_or_verified_drafts():
    """Prompt lookup's host time may round to 0 us: a step that verified drafts counts as drafting too."""
    records = [decode(1, 5_000, drafted=3, drafts=4), decode(2, 6_000, draft_us=800, drafts=4)]
    split = gpu_speculation.draft_split(records)
    assert split["drafting_steps"] == 2 and split["draft_s"] == pytest.approx(0.0008)
    assert split["verify_and_rest_s"] == pytest.approx(0.0102)


def test_no_drafting_steps_split_to_zeros():
    split = gpu_speculation.draft_split([decode(1, 4_000, sequences=64), decode(2, 5_000, sequences=64)])
    assert split["drafting_steps"] == 0 and split["draft_s"] == 0 and split["draft_share"] == 0.0
    assert split["mean_draft_ms"] == 0.0 and split["plain_decode_median_ms"] == 5.0
    assert gpu_speculation.draft_split([])["plain_decode_median_ms"] == 0.0


def test_the_split_reads_the_routers_draft_us_from_a_log(tmp_path):
    line = ("2026-12-05T10:00:00.1Z DEBUG textgen_router::scheduler::step_loop: step step={} sequences=1 decodes=1 "
            "tokens={} ran_us={} device_us=4000 input_wait_us=10 drafts={} drafted={} draft_us={}")  # fmt: skip
    log = tmp_path / "textgen.log"
    log.write_text("\n".join([line.format(1, 5, 8_000, 4, 4, 2_500), line.format(2, 1, 4_500, 0, 0, 0),
                              line.format(3, 5, 6_500, 4, 4, 1_500)]) + "\n")  # fmt: skip
    split = gpu_speculation.draft_split(step_log.read(log))
    assert split["drafting_steps"] == 2 and split["draft_s"] == pytest.approx(0.004)
    assert split["verify_and_rest_s"] == pytest.approx(0.0105) and split["plain_decode_median_ms"] == 4.5


def run(tok_s, drafted=0.0, kept=0.0, split=None):
    out = {"output_tok_s": tok_s, "drafted": drafted, "kept": kept}
    return out | ({"split": split} if split else {})


def test_report_tables_prompt_lookup_and_the_draft_models_split():
    split = gpu_speculation.draft_split([decode(1, 9_000, draft_us=3_000, drafted=4, drafts=4), decode(2, 4_500)])
    results = {"draft_model": {"shape": "1b"},
               "off": {"batch1": run(200.0), "burst64": run(6000.0)},
               "on": {"batch1": run(190.0, 40, 10), "burst64": run(6100.0)},
               "draft": {"batch1": run(150.0, 160, 3, split),
                         "burst64": run(5900.0, 0, 0, gpu_speculation.draft_split([]))}}  # fmt: skip
    text = gpu_speculation.report(results, ["batch1", "burst64"])
    lines = text.splitlines()
    assert "| batch1 | 200.0 | 190.0 | 0.950 | 40 | 10 | 0.250 |" in lines
    assert "| burst64 | 6000.0 | 6100.0 | 1.017 | 0 | 0 | 0.000 |" in lines
    assert "| batch1 | 200.0 | 150.0 | 0.750 | 160 | 3 | 0.019 | 1 | 0.003 | 0.006 | 0.333 | 3.00 | 6.00 | 4.50 |" in lines
    assert "| burst64 | 6000.0 | 5900.0 | 0.983 | 0 | 0 | 0.000 | 0 | 0.000 | 0.000 | 0.000 | 0.00 | 0.00 | 0.00 |" in lines
    assert "shape 1b" in text
    header = next(line for line in lines if line.startswith("| workload | tok/s off | tok/s draft"))
    assert header.count("|") == lines[lines.index(header) + 1].count("|")  # the alignment row matches


def test_report_names_a_failed_draft_server_and_keeps_the_others():
    results = {"off": {"batch1": run(200.0)}, "on": {"batch1": run(190.0)},
               "draft": {"flags": [], "error": "RuntimeError: launcher exited with 2"}}  # fmt: skip
    text = gpu_speculation.report(results, ["batch1"])
    assert "Server `draft` failed: RuntimeError: launcher exited with 2" in text
    assert "| batch1 | 200.0 | 190.0 | 0.950 | 0 | 0 | 0.000 |" in text and "tok/s draft" not in text
    no_draft = gpu_speculation.report({"off": {"batch1": run(200.0)}, "on": {"batch1": run(190.0)}}, ["batch1"])
    assert "tok/s draft" not in no_draft


def args_for(*argv):
    return gpu_speculation.parse_args(["--tokenizer-dir", "T", "--router-binary", "R", "--out", "O", *argv])


def test_the_draft_server_speculates_from_the_draft_dir_and_none_leaves_it_out():
    args = args_for("--speculate", "3")
    assert args.draft_shape == "1b" and args.draft_dir == Path("/tmp/llama1b-random")
    assert args.workload_names == ["batch1", "burst64", "burst256"]
    assert gpu_speculation.servers(args) == [
        ("prompts", []), ("off", []), ("on", ["--speculate", "3"]),
        ("draft", ["--speculate", "3", "--speculative-model", "/tmp/llama1b-random"])]  # fmt: skip
    assert [name for name, _ in gpu_speculation.servers(args_for("--draft-shape", "none"))] == ["prompts", "off", "on"]


def test_workloads_are_a_subset_in_their_own_order(capsys):
    assert args_for("--workloads", "burst256,batch1").workload_names == ["batch1", "burst256"]
    with pytest.raises(SystemExit):
        args_for("--workloads", "batch1,mix")
    assert "unknown workloads: mix" in capsys.readouterr().err


def test_the_1b_is_the_default_draft_and_a_shape():
    assert gpu_model.SHAPES["1b"] is gpu_model.LLAMA32_1B
    assert args_for().draft_shape in gpu_model.SHAPES


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    from launcher.demo_model import ensure_demo_model

    return ensure_demo_model()


def test_the_draft_is_written_once_with_the_targets_tokenizer_then_found(tmp_path, tokenizer_dir):
    args = argparse.Namespace(draft_shape="tiny-1b", draft_dir=tmp_path / "draft", tokenizer_dir=tokenizer_dir)
    written = gpu_speculation.draft_model(args, device="cpu")
    assert "write_s" in written and "reused" not in written
    assert written["parameters"] == sum(spec.numel for spec in gpu_model.tensor_specs(gpu_model.TINY_1B))
    assert written["bytes"] == gpu_model.weights_bytes(args.draft_dir) > 2 * written["parameters"]
    config = json.loads((args.draft_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["hidden_size"] == 64
    assert (args.draft_dir / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()
    assert gpu_speculation.draft_model(args, device="cpu").get("reused")
    # Another tokenizer beside the tiny weights: written again (the shard would refuse the pair).
    other = tmp_path / "other-tokenizer"
    other.mkdir()
    for name in gpu_model.TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, other / name)
    spec = json.loads((other / "tokenizer.json").read_text())
    spec["added_tokens"] = [dict(spec["added_tokens"][0], content="<|other|>")] + spec["added_tokens"][1:]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    args.tokenizer_dir = other
    again = gpu_speculation.draft_model(args, device="cpu")
    assert "write_s" in again
    assert (args.draft_dir / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()
