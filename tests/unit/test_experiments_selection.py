"""experiments/prm_selection.py's selection rules on one hand-made question.

Study `why-best-of-n-stayed-near-greedy` quotes what these rules picked on real samples.
"""

from experiments.prm_selection import by_type, dump, rank_sum, rules


def cand(scores, lik, answer, right):
    return {"scores": scores, "lik": lik, "answer": answer, "right": right}


# Mean line score picks the first, likelihood the second; ranked by mean 3, 1, 2, 0 and by likelihood
# 0, 3, 2, 1, the second and third tie at 4 and the third's higher mean breaks the tie.
CANDS = [cand([0.9], -3.0, "3", False), cand([0.2], -0.1, "5", False),
         cand([0.8], -0.2, "4", True), cand([0.1], -2.0, "3", False)]
QUESTION = {"row": {"answer": "4", "answer_type": "number", "task_type": "counting"},
            "greedy": [cand([0.95], -0.5, "4", True)], 0.8: CANDS}


def test_rank_sum_picks_what_neither_score_picks_alone():
    assert rank_sum(CANDS) is CANDS[2]
    assert rank_sum(CANDS[:1]) is CANDS[0]


def test_rules_on_one_question():
    got = rules([QUESTION], 0.8, 4)
    assert got == {
        "random": 0.0, "bo/min": 0.0, "bo/mean": 0.0, "bo/last": 0.0,
        "g+bo/min": 1.0,    # greedy (0.95) joins the first three samples
        "vote/min": 0.0,    # "3" sums 0.9 + 0.1 against "4"'s 0.8
        "lik/mean": 0.0, "rank/mean+lik": 1.0,
        "maj": 0.0,         # "3" twice
        "pass": 1.0,
    }
    assert rules([QUESTION], 0.8, 2)["pass"] == 0.0  # the right sample is the third


def test_by_type_counts_the_mixed_question():
    assert by_type([QUESTION], 0.8, 4, "mean") == {
        "counting": {"questions": 1, "greedy": 1, "bo/mean": 0, "pass": 1, "mixed": 1, "mixed_picked_right": 0,
                     "mixed_random_pick": 0.25}}  # one right sample of the four


def test_dump_keeps_scores_without_texts():
    out = dump({**QUESTION, 0.8: [{**c, "text": "Step 1: ..."} for c in CANDS]}, [0.8])
    assert out["task_type"] == "counting" and out["answer_type"] == "number"
    assert out["0.8"][2] == {"answer": "4", "right": True, "scores": [0.8], "lik": -0.2}
    assert "text" not in out["greedy"][0]
