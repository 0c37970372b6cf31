"""bench/gpu_speculation.py's pieces on CPU: the time split of the steps that drafted, from the
router's step records; the markdown report of the four servers and the bars; the servers' flags
(vLLM's n-gram config), the server and workload subsets; the planted copies of the prompts at
a known acceptance, the plan saved and found again; counters with labels (vLLM's); the predictable
models written, found and merged results refused at another acceptance."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_model, gpu_speculation, predictable_model, step_log  # noqa: E402
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


def test_report_tables_prompt_lookup_the_draft_models_split_vllm_and_the_bars():
    split = gpu_speculation.draft_split([decode(1, 9_000, draft_us=3_000, drafted=4, drafts=4), decode(2, 4_500)])
    results = {"acceptance": 0.9, "speculate": 4, "draft_model": {"shape": "1b", "agreement": 0.9},
               "prompts": {"stats": {"answers_as_constructed": 1.0, "replaced_share": 0.1}},
               "off": {"batch1": run(200.0), "burst64": run(6000.0)},
               "on": {"batch1": run(520.0, 400, 310), "burst64": run(6100.0)},
               "draft": {"batch1": run(450.0, 160, 120, split),
                         "burst64": run(5900.0, 0, 0, gpu_speculation.draft_split([]))},
               "vllm": {"batch1": run(400.0, 500, 380), "burst64": run(6500.0, 9000, 7000)}}  # fmt: skip
    text = gpu_speculation.report(results, ["batch1", "burst64"])
    lines = text.splitlines()
    assert "Nominal acceptance 0.90 a draft (k = 4): expected kept / drafted 0.774 for independent drafts" in text
    assert "Prompts server: 1.0000 of its answers' tokens are the construction's; 0.100 of C replaced" in text
    assert "| batch1 | 200.0 | 520.0 | 2.600 | 400 | 310 | 0.775 |" in lines
    assert "| burst64 | 6000.0 | 6100.0 | 1.017 | 0 | 0 | 0.000 |" in lines
    assert ("| batch1 | 200.0 | 450.0 | 2.250 | 160 | 120 | 0.750 | 1 | 0.003 | 0.006 | 0.333 | 3.00 | 6.00 | 4.50 |"
            in lines)  # fmt: skip
    assert ("| burst64 | 6000.0 | 5900.0 | 0.983 | 0 | 0 | 0.000 | 0 | 0.000 | 0.000 | 0.000 | 0.00 | 0.00 | 0.00 |"
            in lines)  # fmt: skip
    assert "shape 1b, agreeing with the model on 0.90 of the token ids" in text
    assert "| batch1 | 400.0 | 520.0 | 1.300 | 500 | 380 | 0.760 |" in lines
    assert "| burst64 | 6500.0 | 6100.0 | 0.938 | 9000 | 7000 | 0.778 |" in lines
    assert "| batch1 on / off | 2.600 | 2.5 | yes |" in lines and "| burst64 on / off | 1.017 | 1.0 | yes |" in lines
    assert "| batch1 on / vLLM ngram | 1.300 | 1.1 | yes |" in lines
    assert "| burst64 on / vLLM ngram | 0.938 | 1.0 | no |" in lines
    for header in (l for l in lines if l.startswith("| workload") or l.startswith("| bar")):
        assert header.count("|") == lines[lines.index(header) + 1].count("|")  # the alignment row matches


def test_report_names_a_failed_or_skipped_server_and_keeps_the_others():
    results = {"off": {"batch1": run(200.0)}, "on": {"batch1": run(190.0)},
               "draft": {"flags": [], "error": "RuntimeError: launcher exited with 2"},
               "vllm": {"skipped": "no --peer-env"}}  # fmt: skip
    text = gpu_speculation.report(results, ["batch1"])
    assert "Server `draft` failed: RuntimeError: launcher exited with 2" in text
    assert "Server `vllm` skipped: no --peer-env" in text
    assert "| batch1 | 200.0 | 190.0 | 0.950 | 0 | 0 | 0.000 |" in text
    assert "tok/s draft" not in text and "tok/s vLLM" not in text
    results["on"]["batch1"] |= {"errors": 2, "requests": 3, "first_errors": ["HTTP 500: b'x'", "HTTP 500: b'y'"]}
    assert ("Server `on`, batch1: 2 of 3 requests failed (HTTP 500: b'x'; HTTP 500: b'y')"
            in gpu_speculation.report(results, ["batch1"]))  # fmt: skip
    assert "| batch1 on / off | 0.950 | 2.5 | no |" in text and "vLLM ngram |" not in text


def test_the_expected_kept_share_of_independent_drafts():
    assert gpu_speculation.expected_kept_share(0.9, 4) == pytest.approx((0.9 + 0.81 + 0.729 + 0.6561) / 4)
    assert gpu_speculation.expected_kept_share(1.0, 4) == 1.0 and gpu_speculation.expected_kept_share(0.0, 4) == 0.0


def args_for(*argv):
    return gpu_speculation.parse_args(["--tokenizer-dir", "T", "--router-binary", "R", "--out", "O", *argv])


def test_the_servers_their_flags_and_subsets():
    args = args_for("--speculate", "3")
    assert args.draft_shape == "1b" and args.draft_dir == Path("/tmp/llama1b-predictable")
    assert args.model_dir == Path("/tmp/llama8b-predictable") and args.shape == "8b" and args.acceptance == 0.96
    assert args.workload_names == ["batch1", "burst64", "burst256"]
    servers = gpu_speculation.servers(args)
    draft = ["--speculate", "3", "--speculative-model", "/tmp/llama1b-predictable"]
    assert servers[:3] == [("off", []), ("on", ["--speculate", "3"]), ("draft", draft)]
    name, flags = servers[3]
    assert name == "vllm" and flags[0] == "--speculative-config"
    assert json.loads(flags[1]) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                    "prompt_lookup_min": 2}  # fmt: skip
    assert [n for n, _ in gpu_speculation.servers(args_for("--draft-shape", "none"))] == ["off", "on", "vllm"]
    assert [n for n, _ in gpu_speculation.servers(args_for("--servers", "vllm,off"))] == ["off", "vllm"]


def test_workloads_servers_and_acceptance_are_checked(capsys):
    assert args_for("--workloads", "burst256,batch1").workload_names == ["batch1", "burst256"]
    with pytest.raises(SystemExit):
        args_for("--workloads", "batch1,mix")
    assert "unknown workloads: mix" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        args_for("--servers", "on,sglang")
    assert "unknown servers: sglang" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        args_for("--acceptance", "1.5")
    with pytest.raises(SystemExit):
        args_for("--shape", "tiny-1b")  # tied: no predictable target


def test_the_1b_is_the_default_draft_and_a_shape():
    assert gpu_model.SHAPES["1b"] is gpu_model.LLAMA32_1B
    assert args_for().draft_shape in gpu_model.SHAPES


# -- prompts ----------------------------------------------------------------------------------
def test_a_planted_copy_replaces_exactly_the_share_not_kept_with_other_ids():
    answer = list(range(1000, 1512))
    copy = gpu_speculation.planted(answer, 0.9, random.Random(0), 49152)
    replaced = [i for i, (a, b) in enumerate(zip(answer, copy)) if a != b]
    assert len(copy) == 512 and len(replaced) == round(0.1 * 512) == 51
    assert all(256 <= copy[i] < 49152 for i in replaced)
    assert copy == gpu_speculation.planted(answer, 0.9, random.Random(0), 49152)  # seeded
    assert gpu_speculation.planted(answer, 1.0, random.Random(0), 49152) == answer


class FakeTokenizer:
    """Ids as text: `decode` joins them, `encode` splits them back (the demo tokenizer's round trip)."""

    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    def decode(self, ids):
        return " ".join(map(str, ids))

    def encode(self, text, add_special_tokens=False):
        return self.Encoding([int(t) for t in text.split()])


def test_the_plan_is_p_c_planted_p_and_counts_the_answers_that_are_the_constructions(monkeypatch):
    table = predictable_model.successor_table(gpu_speculation.TEXT_VOCAB)
    answers = {}

    def continuation(url, prompt, tokens):  # the predictable model: the cycle after the last token
        answers[prompt] = predictable_model.chain(table, int(prompt.split()[-1]), tokens)
        if len(answers) == 1:
            answers[prompt][5] = 300  # one wrong token: counted
        return answers[prompt]

    monkeypatch.setattr(gpu_speculation, "continuation", continuation)
    plan = gpu_speculation.make_plan("http://x", FakeTokenizer(), ["batch1", "burst64"], 0.9, table)
    assert set(plan["workloads"]) == {"batch1", "burst64"} and plan["acceptance"] == 0.9
    batch1, burst = plan["workloads"]["batch1"], plan["workloads"]["burst64"]
    assert batch1["max_tokens"] == 512 and len(batch1["runs"]) == 3 and all(len(r) == 1 for r in batch1["runs"])
    assert burst["max_tokens"] == 256 and len(burst["runs"]) == 1 and len(burst["runs"][0]) == 64
    for run_ in (batch1["runs"][0], burst["runs"][0]):
        prompt = run_[0]
        n = gpu_speculation.PROMPT_TOKENS
        p, copy, again = prompt[:n], prompt[n:-n], prompt[-n:]
        assert p == again and len(copy) == len(prompt) - 2 * n
        c = answers[FakeTokenizer().decode(p)]
        assert sum(a != b for a, b in zip(c, copy)) == round(0.1 * len(c))
    stats = plan["stats"]
    assert stats["answer_tokens"] == 3 * 512 + 64 * 256
    assert stats["answers_as_constructed"] == pytest.approx(1 - 1 / stats["answer_tokens"])
    assert stats["replaced_share"] == pytest.approx(0.1, abs=0.002)
    assert plan["prompt_lengths"]["batch1"] == [128 + 512 + 128]
    measured = gpu_speculation.requests(plan)
    assert measured["burst64"][0][0].prompt == burst["runs"][0][0] and measured["burst64"][0][0].max_tokens == 256


def test_a_saved_plan_is_found_only_for_the_same_model_acceptance_and_workloads(tmp_path):
    plan = {"acceptance": 0.9, "model": {"role": "target", "seed": 0},
            "workloads": {"batch1": {"runs": [[[1, 2]]], "max_tokens": 4},
                          "burst64": {"runs": [[[3]]], "max_tokens": 2}},
            "prompt_lengths": {}, "stats": {}}  # fmt: skip
    path = tmp_path / "plan.json"
    assert gpu_speculation.load_plan(path, ["batch1"], 0.9, plan["model"]) is None
    path.write_text(json.dumps(plan))
    found = gpu_speculation.load_plan(path, ["batch1"], 0.9, plan["model"])
    assert found is not None and list(found["workloads"]) == ["batch1"]
    assert gpu_speculation.load_plan(path, ["batch1"], 0.8, plan["model"]) is None
    assert gpu_speculation.load_plan(path, ["batch1"], 0.9, {"role": "target", "seed": 1}) is None
    assert gpu_speculation.load_plan(path, ["batch1", "burst256"], 0.9, plan["model"]) is None


def test_counters_sum_labelled_series(monkeypatch):
    text = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 8.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 40.0
textgen_speculative_draft_tokens_total 12
"""

    class Response:
        def __init__(self, text):
            self.text = text

    monkeypatch.setattr(gpu_speculation.httpx, "get", lambda url, timeout: Response(text))
    assert gpu_speculation.counters("u", gpu_speculation.VLLM_COUNTER_NAMES) == {
        "vllm:spec_decode_num_draft_tokens_total": 128.0, "vllm:spec_decode_num_accepted_tokens_total": 90.0}
    assert gpu_speculation.counters("u") == {"textgen_speculative_draft_tokens_total": 12.0,
                                             "textgen_speculative_accepted_tokens_total": 0.0}  # fmt: skip


# -- models and results -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    from launcher.demo_model import ensure_demo_model

    return ensure_demo_model()


def test_the_models_are_written_once_with_the_targets_tokenizer_then_found(tmp_path, tokenizer_dir):
    args = args_for("--shape", "tiny", "--draft-shape", "tiny-draft", "--model-dir", str(tmp_path / "target"),
                    "--draft-dir", str(tmp_path / "draft"), "--acceptance", "0.8")  # fmt: skip
    args.tokenizer_dir = tokenizer_dir
    written = gpu_speculation.write_models(args, device="cpu")
    assert "write_s" in written["model"] and "write_s" in written["draft"]
    assert written["model"]["draft_hidden"] == 32 and written["draft"]["agreement"] == 0.8
    specs = gpu_model.tensor_specs(predictable_model.draft_shape("tiny-draft"))
    assert written["draft"]["parameters"] == sum(s.numel for s in specs)
    assert (args.draft_dir / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()
    again = gpu_speculation.write_models(args, device="cpu")
    assert again["model"]["reused"] and again["draft"]["reused"]
    assert gpu_speculation.model_identity(args)["draft_hidden"] == 32
    # Without the draft server no draft is written; the target is the same one.
    only = with_tokenizer(args_for("--shape", "tiny", "--draft-shape", "tiny-draft", "--servers", "off,vllm",
                                   "--model-dir", str(args.model_dir)), tokenizer_dir)  # fmt: skip
    written = gpu_speculation.write_models(only, device="cpu")
    assert "draft" not in written and written["model"]["reused"]
    plain = with_tokenizer(args_for("--shape", "tiny", "--draft-shape", "none", "--model-dir", str(tmp_path / "plain")),
                           tokenizer_dir)  # fmt: skip
    written = gpu_speculation.write_models(plain, device="cpu")
    assert written["model"]["draft_hidden"] == 32 and "draft" not in written  # half the target's own hidden size


def with_tokenizer(args, tokenizer_dir):
    args.tokenizer_dir = tokenizer_dir
    return args


def test_results_merge_only_a_run_of_the_same_acceptance(tmp_path):
    args = args_for("--out", str(tmp_path))
    assert gpu_speculation.load_results(args) == {}
    gpu_speculation.save(args, {"acceptance": 0.96, "speculate": 4, "off": {"batch1": run(1.0)}})
    assert gpu_speculation.load_results(args)["off"] == {"batch1": run(1.0)}
    with pytest.raises(SystemExit, match="acceptance 0.96"):
        gpu_speculation.load_results(args_for("--out", str(tmp_path), "--acceptance", "0.8"))
