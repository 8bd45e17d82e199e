"""How a shadow's outputs are compared with the served ones."""

from __future__ import annotations

import numpy as np

from tensorgate.models.shadow import compare


def test_equal_outputs_match() -> None:
    out = {"y": np.array([[0.1, 0.9]], dtype=np.float32), "labels": np.array([b"cat"], dtype=object)}
    assert compare(out, {k: v.copy() for k, v in out.items()}, 1e-5) == (False, False, 0.0)


def test_a_difference_within_the_relative_tolerance_matches() -> None:
    served = {"y": np.array([1000.0, -2.0])}
    mismatch, _, largest = compare(served, {"y": np.array([1000.005, -2.00001])}, 1e-5)
    assert not mismatch and np.isclose(largest, 0.005)
    assert compare(served, {"y": np.array([1000.5, -2.0])}, 1e-5)[0]


def test_a_classification_output_counts_a_changed_class_apart_from_drift() -> None:
    served = {"p": np.array([[0.2, 0.8], [0.6, 0.4]], dtype=np.float32)}
    drifted = {"p": np.array([[0.25, 0.75], [0.55, 0.45]], dtype=np.float32)}
    flipped = {"p": np.array([[0.8, 0.2], [0.6, 0.4]], dtype=np.float32)}
    assert compare(served, drifted, 1e-5)[:2] == (True, False)
    assert compare(served, flipped, 1e-5)[:2] == (True, True)
    assert compare(served, flipped, 10.0)[:2] == (True, True)  # a changed decision, whatever the tolerance


def test_missing_or_reshaped_outputs_and_other_strings_mismatch() -> None:
    served = {"y": np.zeros((2, 3)), "s": np.array([b"a"], dtype=object)}
    assert compare(served, {"y": np.zeros((2, 3))}, 1e-5)[0]
    assert compare(served, {"y": np.zeros((3, 2)), "s": served["s"]}, 1e-5)[0]
    assert compare(served, {"y": np.zeros((2, 3)), "s": np.array([b"b"], dtype=object)}, 1e-5)[0]
