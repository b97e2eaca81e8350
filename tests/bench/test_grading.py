import json
import threading
import time

import pytest

from bench.grading import CORRECT, TIMEOUT, UNPARSEABLE, WRONG, Grader, extract

pytestmark = pytest.mark.integration


def test_verdict_kinds(grader):
    v = grader.grade([r"so \boxed{68}", r"\boxed{0.5}", "no box here", r"\boxed{69}", r"\boxed{\frac{1}{2}}"],
                     ["68", r"\frac12", "1", "68", "0.5"])
    assert [x.status for x in v] == [CORRECT, CORRECT, UNPARSEABLE, WRONG, CORRECT]
    assert "no \\boxed" in v[2].reason and v[3].extracted == "69"


def test_unparseable_gold_is_reported_not_wrong(grader):
    assert grader.unparseable_golds(["42", r"\frac{"]) == [r"\frac{"]
    (v,) = grader.grade([r"\boxed{1}"], [r"\frac{"])
    assert v.status == UNPARSEABLE and "gold" in v.reason


def test_all_paper_golds_parse_and_verify_against_themselves(grader, shared_data):
    golds = [json.loads(line)["answer"] for line in open(f"{shared_data}/sanity_r1d_1p5b.jsonl")]
    assert len(golds) == 1460
    assert grader.unparseable_golds(golds) == []
    verdicts = grader.grade([f"The answer is \\boxed{{{g.strip()}}}." for g in golds], golds)
    bad = [(g, v.reason) for g, v in zip(golds, verdicts) if not v.correct]
    assert bad == []


def test_cache_hits_on_repeated_pairs():
    with Grader(workers=1) as g:
        g.grade([r"\boxed{4}"] * 10, ["4"] * 10)
        assert g.hits == 9 and len(g.cache) == 1


def test_hostile_answers_finish_within_their_timeouts():
    hostile = [
        "\\boxed{" + "{" * 500 + "1" + "}" * 500 + "}",                    # deep nesting
        r"\boxed{9^{9^{9^{9^{9^{9}}}}}}",                                    # huge exponent
        r"\boxed{10^{10^{10^{10}}}!}",
        r"\boxed{\frac{1}{2}",                                              # unbalanced
        "x" * 100_000 + r" \boxed{3}",                                      # 100 kB response
        r"\boxed{" + "1+" * 3000 + "1}",                                    # long sum
        r"\boxed{½ ∞ √2 αβγ 🙂}",                                            # unicode
        "\\boxed{" + "\\sqrt{" * 200 + "2" + "}" * 200 + "}",
    ]
    t0 = time.time()
    with Grader(workers=2, timeout=3.0) as g:
        v = g.grade(hostile, ["3"] * len(hostile))
    elapsed = time.time() - t0
    assert len(v) == len(hostile)
    assert v[4].status == CORRECT                                           # the 100 kB one is just long
    assert all(x.status in (CORRECT, WRONG, TIMEOUT, UNPARSEABLE) for x in v)
    # every answer has a verdict within its timeout (2 workers, 8 answers, 3 s each, plus start-up)
    assert elapsed < 3.0 * len(hostile) / 2 + 20


def test_timeout_kills_a_hung_answer_and_pool_recovers():
    from bench import grading

    with Grader(workers=1, timeout=1.0) as g:
        fut = g._pool.schedule(time.sleep, args=(30,), timeout=1.0)
        t0 = time.time()
        with pytest.raises(TimeoutError):          # pebble's timeout, not any error
            fut.result()
        assert time.time() - t0 < 10
        (v,) = g.grade([r"\boxed{2}"], ["2"])      # the pool still works after a killed worker
        assert v.status == grading.CORRECT


def test_grading_works_off_the_main_thread():
    """math-verify's SIGALRM timeout fails silently in threads (verl #3407); ours must not."""
    result = {}

    def work():
        with Grader(workers=1) as g:
            result["v"] = g.grade([r"\boxed{\frac{3}{4}}", r"\boxed{5}"], ["0.75", "6"])

    t = threading.Thread(target=work)
    t.start()
    t.join(120)
    assert [v.status for v in result["v"]] == [CORRECT, WRONG]


def test_extract_last_box_only():
    assert extract(r"\boxed{840}\boxed{840}") == "840"


def test_cli_grade(tmp_path):
    from typer.testing import CliRunner

    from bench.cli import app

    f = tmp_path / "a.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [{"response": r"\boxed{2}", "gold": "2"},
                                                   {"response": "none", "gold": "3"}]))
    r = CliRunner().invoke(app, ["grade", str(f), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["counts"] == {"correct": 1, "unparseable": 1} and summary["accuracy"] == 0.5
    f.write_text("{broken\n")
    r = CliRunner().invoke(app, ["grade", str(f)])
    assert r.exit_code == 2 and "malformed JSON" in r.output
