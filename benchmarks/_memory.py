"""Peak resident memory of a benchmark process, sampled from /proc."""

import resource
import threading


def anonymous_rss() -> int:
    """The process's anonymous resident memory in bytes (``RssAnon``): not the file pages of a memmap."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakMemory:
    """Peak resident memory above the level at start, sampled every millisecond from /proc.

    ``anonymous=True`` samples ``RssAnon`` instead of the whole resident set,
    so that the page cache of a memory-mapped file, which the OS can drop at
    any time, does not count.
    """

    def __init__(self, anonymous: bool = False, interval: float = 0.001):
        self._read = anonymous_rss if anonymous else self._rss
        self._interval = interval
        self.peak = self.start = self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    def _sample(self):
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._read())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._read())

    @property
    def mb(self) -> float:
        return (self.peak - self.start) / 2**20
