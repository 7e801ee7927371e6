"""Pass@k against hand-computed values (Chen et al. 2021, eq. 1)."""

import pytest

from rlzoo.passk import mean_pass_at_k, pass_at_k


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # one right in four: a single draw finds it 1/4 of the time
    # 2 of 4 right, k=2: 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    # 1 of 8 right, k=4: 1 - C(7,4)/C(8,4) = 1 - 35/70 = 0.5
    assert pass_at_k(8, 1, 4) == pytest.approx(0.5)
    assert pass_at_k(8, 5, 4) == 1.0  # n - c = 3 < k: every 4-subset holds a right one


def test_pass_at_1_is_the_share_correct():
    for n in range(1, 9):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_mean_over_prompts():
    out = mean_pass_at_k([4, 4], [1, 2], [1, 2])
    assert out["eval/pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert out["eval/pass@2"] == pytest.approx(((1 - 3 / 6) + 5 / 6) / 2)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 5, 1), (4, 1, 0)])
def test_out_of_range(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
