"""Peak resident memory of a benchmark process, sampled from /proc."""

import resource
import threading


class PeakMemory:
    """Peak resident memory above the level at start, sampled every millisecond from /proc."""

    def __init__(self):
        self.peak = self.start = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def mb(self) -> float:
        return (self.peak - self.start) / 2**20
