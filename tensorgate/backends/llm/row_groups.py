"""Which rows of a step run together: prompts grouped by length, decode rows by the keys they need.

Pure arithmetic over lengths (no torch), so the choices are tested apart from the model.
"""

from __future__ import annotations

# Consecutive row ranges of a decode batch and how many of the last key columns each range needs.
RowGroups = list[tuple[int, int, int]]

# Prompts prefilled together are left-padded to the longest, and the padding costs as much as real
# tokens (more in attention, which grows with the square of the width). Several prompts of one step
# run as groups of similar lengths when a split saves at least MIN_PAD_SAVING of the token slots
# and at least MIN_SAVED_SLOTS of them: a forward has a fixed cost too (on the benchmark's small
# Llama, about what 500 token slots cost), so small savings are not worth another forward.
MIN_PAD_SAVING = 0.2
MIN_SAVED_SLOTS = 256
MAX_GROUP_DEPTH = 2  # at most 4 forwards per step

# A decode step's attention over the padded batch is its largest cost, and the padding is wasted:
# rows sit in the batch longest first, and ranges of shorter rows attend over only the key columns
# they need when that saves at least this many (row, key) pairs. A range costs three more tensor
# operations per layer, about what 2,000 pairs cost on the benchmark's small Llama.
MIN_SAVED_KEY_SLOTS = 4096


def similar_widths(
    widths: list[int], low: int, high: int, depth: int = MAX_GROUP_DEPTH, min_saved: int = MIN_SAVED_SLOTS
) -> list[tuple[int, int]]:
    """Row ranges of ``widths`` (sorted, longest first) to pad and run together."""
    whole = (high - low) * widths[low]
    if depth == 0 or high - low < 2:
        return [(low, high)]
    split = min(range(low + 1, high), key=lambda k: (k - low) * widths[low] + (high - k) * widths[k])
    saved = whole - (split - low) * widths[low] - (high - split) * widths[split]
    if saved < MIN_PAD_SAVING * whole or saved < min_saved:
        return [(low, high)]
    return similar_widths(widths, low, split, depth - 1, min_saved) + similar_widths(
        widths, split, high, depth - 1, min_saved
    )


def row_ranges(lengths: list[int]) -> list[tuple[int, int]]:
    """Ranges of decode rows (about longest first) worth attending over different key columns."""
    widths = lengths[:]
    for i in range(len(widths) - 2, -1, -1):  # a range needs its longest row's columns
        widths[i] = max(widths[i], widths[i + 1])
    return similar_widths(widths, 0, len(widths), min_saved=MIN_SAVED_KEY_SLOTS)


def row_groups(ranges: list[tuple[int, int]], lengths: list[int]) -> RowGroups:
    """Each range with the key columns its longest row needs this step."""
    return [(first, end, max(lengths[first:end])) for first, end in ranges]
