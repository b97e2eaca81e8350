"""tests/xdist_order.py: the units of work handed to xdist's workers longest first by the record,
the rest after in collection order, a file's tests in their order; the group a node id carries."""

from xdist_order import group_of, longest_first


def test_longest_first_keeps_each_files_order_and_puts_unrecorded_files_last():
    items = ["a1", "b1", "a2", "c1", "d1", "b2", "e1"]        # file = first letter, collection order
    seconds = {"b": 5.0, "c": 9.0, "a": 0.0}
    assert longest_first(items, lambda i: i[0], seconds) == ["c1", "b1", "b2", "a1", "a2", "d1", "e1"]


def test_no_record_keeps_the_collection_order():
    items = ["a1", "b1", "a2"]
    assert longest_first(items, lambda i: i[0], {}) == ["a1", "a2", "b1"]


def test_group_of_reads_the_loadgroup_suffix():
    assert group_of("tests/x/test_y.py::test_z[fp16]@test_y") == "test_y"
    assert group_of("tests/x/test_y.py::test_z[a@b]@verl") == "verl"
    assert group_of("tests/x/test_y.py::test_z") is None
    assert group_of("tests/x/test_y.py::test_z[a@b]") is None          # an "@" inside a parameter only
