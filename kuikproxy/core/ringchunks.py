"""A chunk of a ring's images stored by column: keys as ``bytes`` in byte-wise order and one array
per number (lap, last-asked seq, asked, answered, walked past), as :mod:`kuikproxy.core.ringtable`
keeps them past a few images. An image costs its key, one list slot and 32 B of arrays, and no
object the cyclic GC tracks."""

from __future__ import annotations

from array import array


class Chunk:
    __slots__ = ("answered", "asked", "keys", "laps", "passed", "seqs")

    def __init__(
        self, keys: list[bytes], laps: array[int], seqs: array[int], asked: array[float], *,
        answered: array[float], passed: array[float],
    ) -> None:  # fmt: skip
        self.keys = keys
        self.laps = laps  # the last lap each image was done in
        self.seqs = seqs  # last-asked order
        self.asked = asked
        self.answered = answered
        self.passed = passed  # prefetch: when the walk last went past

    def undone(self, start: int, stop: int, lap: int) -> list[str]:
        """The images ``start:stop`` not done in ``lap``."""
        pairs = zip(self.keys[start:stop], self.laps[start:stop], strict=True)
        return [k.decode() for k, done in pairs if done < lap]

    def walked_past(self, start: int, stop: int, lap: int, now: float) -> None:
        """Images ``start:stop`` are done in ``lap``, walked past at ``now``."""
        self.laps[start:stop] = array("i", [lap]) * (stop - start)
        self.passed[start:stop] = array("d", [now]) * (stop - start)

    def split(self) -> Chunk:
        """Move the upper half into a new chunk, returned."""
        half = len(self.keys) // 2
        upper = Chunk(
            self.keys[half:], self.laps[half:], self.seqs[half:], self.asked[half:],
            answered=self.answered[half:], passed=self.passed[half:],
        )  # fmt: skip
        del self.keys[half:], self.laps[half:], self.seqs[half:], self.asked[half:]
        del self.answered[half:], self.passed[half:]
        return upper
