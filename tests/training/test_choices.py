"""check_choice: a value checked against its Literal type, the one source of the option's choices."""

from typing import Literal

import pytest

from kpca.training.choices import check_choice, choices, is_choice, keyed_by_choices

Mode = Literal["error", "skip"]


def test_the_choices_are_the_literal_values_in_order():
    assert choices(Mode) == ("error", "skip")
    assert choices(Literal["digits"] | None) == ("digits", None)
    assert choices(Literal["a"] | Literal["b", 1]) == ("a", "b", 1)


@pytest.mark.parametrize("not_a_literal", [str, int | None, "error", ("error", "skip")])
def test_a_type_that_is_no_literal_is_refused(not_a_literal: object):
    with pytest.raises(TypeError, match="is not a Literal type"):
        choices(not_a_literal)


def test_values_match_by_value_and_type():
    assert is_choice("skip", Mode) and not is_choice("Skip", Mode)
    assert not is_choice(True, Literal[1, 2]) and is_choice(1, Literal[1, 2])  # True == 1 in Python, not here
    assert not is_choice(1, Literal[True]) and is_choice(True, Literal[True])
    assert is_choice(None, Literal["digits"] | None) and not is_choice(None, Mode)
    assert not is_choice(["error"], Mode)  # unhashable values are compared, not looked up


def test_a_wrong_value_names_the_option_the_value_the_choices_and_the_fix():
    check_choice("data.bad_files", "skip", Mode)
    with pytest.raises(ValueError) as caught:
        check_choice("data.bad_files", "ignore", Mode)
    assert str(caught.value) == "data.bad_files='ignore' is not one of 'error', 'skip'; choose one of them."
    with pytest.raises(ValueError) as caught:
        check_choice("labels", True, Literal["ground_truth", "predicted"], "write a word (YAML's true is a boolean).")
    assert str(caught.value) == (
        "labels=True is not one of 'ground_truth', 'predicted'; write a word (YAML's true is a boolean)."
    )


def test_a_table_keyed_by_a_literal_is_in_its_order_and_covers_exactly_its_values():
    letter = Literal["a", "b"]
    assert list(keyed_by_choices(letter, {"b": 2, "a": 1})) == ["a", "b"]
    with pytest.raises(TypeError, match=r"\['a'\] are not the values of"):
        keyed_by_choices(letter, {"a": 1})
    with pytest.raises(TypeError, match="not the values of"):
        keyed_by_choices(letter, {"a": 1, "b": 2, "c": 3})
