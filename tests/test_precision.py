import pytest

from bench.precision import ALL_PAIRS, Precision, PrecisionError, parse_list


def test_parse_pairs():
    assert Precision.parse("fp16") == Precision("fp16", "fp16")
    assert Precision.parse("rollout=fp32,train=bf16") == Precision("fp32", "bf16")
    assert Precision.parse("train=bf16,rollout=float32") == Precision("fp32", "bf16")
    assert Precision.parse("rollout=fp32,train=bf16").name == "rollout=fp32,train=bf16"
    assert Precision.parse("bfloat16").name == "bf16"
    assert len(ALL_PAIRS) == 9 and len(set(ALL_PAIRS)) == 9
    assert parse_list("bf16,fp16") == [Precision("bf16", "bf16"), Precision("fp16", "fp16")]
    assert len(parse_list("all")) == 9


@pytest.mark.parametrize("bad", ["fp8", "rollout=fp16", "rollout=fp16,train=int8", "roll=fp16,train=fp16"])
def test_bad_precision_lists_valid(bad):
    with pytest.raises(PrecisionError):
        Precision.parse(bad)
