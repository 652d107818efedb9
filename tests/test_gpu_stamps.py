"""The stamps' host side on the CPU: which run's time a tagged slot holds (the kernel's side
runs on the device: tests/gpu/gpu_times.py)."""

from __future__ import annotations

from autoannot.keep.gpu_stamps import PTX_STORES, fenced_time, ptx, tagged_time


class Tearing(list):
    """A slot whose tag a run writes over between the reader's two reads of it."""

    def __init__(self, words: list[int], later_tag: int) -> None:
        super().__init__(words)
        self.reads, self.later_tag = 0, later_tag

    def __getitem__(self, at: int) -> int:
        if at == 1:
            self.reads += 1
            if self.reads == 2:
                return self.later_tag
        return super().__getitem__(at)


def test_a_tagged_slot_gives_its_runs_time_and_no_other_runs() -> None:
    depth = 4
    slots = [0] * (2 * depth)
    assert tagged_time(slots, 0, 0) == 0  # (never written: not yet)
    slots[0:2] = [1_000, 1]  # (run 0 wrote slot 0: its tag is run + 1)
    assert tagged_time(slots, 0, 0) == 1_000
    assert tagged_time(slots, 0, depth) == 0  # (run 4 shares the slot: not yet)
    slots[0:2] = [5_000, depth + 1]
    assert tagged_time(slots, 0, depth) == 5_000
    assert tagged_time(slots, 0, 0) == -1  # (written over by run 4: lost)


def test_a_fenced_slot_is_read_below_its_points_count_and_lost_once_written_over() -> None:
    depth = 4
    slots, counts = [0] * (2 * depth), [0]
    assert fenced_time(slots, 0, counts, 0, 0, depth) == 0  # (not counted yet)
    slots[0], counts[0] = 1_000, 1  # (run 0: its time, then the count)
    assert fenced_time(slots, 0, counts, 0, 0, depth) == 1_000
    assert fenced_time(slots, 2, counts, 0, 1, depth) == 0  # (run 1 not yet)
    counts[0] = depth + 1  # (run 4 wrote slot 0 over)
    assert fenced_time(slots, 0, counts, 0, 0, depth) == -1


def test_a_slot_written_as_it_is_read_is_read_again_later() -> None:
    torn = Tearing([1_000, 1], later_tag=5)
    assert tagged_time(torn, 0, 0) == 0
    assert tagged_time(Tearing([1_000, 1], later_tag=1), 0, 0) == 1_000


def test_every_kernel_reads_the_clock_before_it_writes_and_the_tagged_one_has_no_fence() -> None:
    kernels = {kind: ptx(kind, "6.4", "sm_75") for kind in PTX_STORES}
    for kind in ("tagged", "fenced"):
        body = kernels[kind]
        assert body.index("%globaltimer") < body.index("st.volatile")
    assert "membar" not in kernels["tagged"] and "membar.sys" in kernels["fenced"]
    assert "st.volatile.v2.u64" in kernels["tagged"]  # (time and tag in one store)
    assert "mul.wide.u32 %rd5, %r3, 16" in kernels["tagged"]  # (16 bytes a slot)
    for text in kernels.values():  # (each formats into one whole entry)
        assert text.count("{") == text.count("}") and text.rstrip().endswith("}")
        assert ".entry autoannot_stamp(" in text and "{{" not in text
