from minicalc import clamp, overlaps


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_below():
    assert clamp(-3, 0, 10) == 0


def test_overlap():
    assert overlaps((0, 5), (3, 8))
