"""The drills of bench/lookup_probe.py, written out by hand for one chart."""

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "lookup_probe", Path(__file__).resolve().parents[2] / "bench" / "lookup_probe.py")
probe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(probe)

HEAD = "Chart: pie. Title: Points by team (pts)."
ROW = {
    "table": json.dumps({"categories": ["Lions", "Tigers", "Eagles"], "values": [[20], [19], [4]]}),
    "prompt": f"{HEAD}\nLions: 20 pink | Tigers: 19 blue | Eagles: 4 brown\nQuestion: Name the Lions colour.\n",
}


class Second:
    """An rng that always picks the second pair and shuffles nothing."""

    def choice(self, seq):
        return seq[1]

    def shuffle(self, seq):
        pass


@pytest.mark.parametrize(
    ("fmt", "values", "line", "answer"),
    [
        ("colon", "chart", "Lions: 20 pink | Tigers: 19 blue | Eagles: 4 brown", "19"),
        ("lead", "chart", "| Lions: 20 pink | Tigers: 19 blue | Eagles: 4 brown", "19"),
        ("nocolon", "chart", "Lions 20 pink | Tigers 19 blue | Eagles 4 brown", "19"),
        ("colon", "plain", "Lions: 20 | Tigers: 19 | Eagles: 4", "19"),
        # 20, 19 and 4 modulo the 12 colours: teal, grey, purple
        ("colon", "colour", "Lions: teal | Tigers: grey | Eagles: purple", "grey"),
        ("nocolon", "colour", "Lions teal | Tigers grey | Eagles purple", "grey"),
    ],
)
def test_lookup_drill(fmt, values, line, answer):
    prompt, target = probe.drill("lookup", ROW, fmt, Second(), values)
    assert prompt == f"{HEAD}\n{line}\nValue for Tigers:"
    assert target == f" Tigers {answer}."


def test_copy_and_multi_drills():
    assert probe.drill("copy", ROW, "colon", Second())[1] == " Lions 20, Tigers 19, Eagles 4."
    prompt, target = probe.drill("multi", ROW, "colon", Second())
    assert prompt.endswith("\nValue for Lions:")
    assert target == " Lions 20.\nValue for Tigers: Tigers 19.\nValue for Eagles: Eagles 4."


def test_spaced_digit_tokenizer_keeps_the_space_with_the_first_digit():
    corpus = ["Fri: 2 | Sat: 19 | Sun: 17\nStep 1: Select the Sat bar: Sat 19.\nAnswer: 19"] * 20
    tokenizer = probe.spaced_digit_tokenizer(corpus, 300)
    ids = tokenizer("Sat: 19 | Sun: 17", add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    colon = pieces.index(":")
    assert pieces[colon + 1 : colon + 3] == [" 1", "9"] and " " not in pieces
    assert tokenizer.decode(ids) == "Sat: 19 | Sun: 17"
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"


def test_key_kind():
    prompt = probe.drill("lookup", ROW, "colon", Second())[0]
    assert probe.key_kind(prompt, " Tigers 19.") == "later"
    assert probe.key_kind(prompt, " Lions 20.") == "first"
    assert probe.key_kind(probe.drill("lookup", ROW, "lead", Second())[0], " Lions 20.") == "first"
    assert probe.key_kind(f"{HEAD}\n2017: 10 | 2018: 12\nValue for 2018:", " 2018 12.") == "year"
