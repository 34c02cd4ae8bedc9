"""The probe of a Ray address before ``ray.init`` (which retries an unreachable one for minutes): no Ray needed."""

import socket

import pytest

from skflow.ray_jobs import RayClusterError
from skflow.ray_jobs._session import probe


def test_an_address_where_nothing_listens_or_that_is_malformed_is_one_clear_error():
    with socket.socket() as taken:  # a port that was free a moment ago: nothing listens there now
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    with pytest.raises(RayClusterError, match=rf"^no Ray cluster answers at 127\.0\.0\.1:{port} \("):
        probe(f"127.0.0.1:{port}", timeout=5)
    for port in ("notaport", "99999", "65536", "0"):  # 99999 raised OverflowError from socket
        with pytest.raises(RayClusterError, match="expected HOST:PORT"):
            probe(f"127.0.0.1:{port}")
    with socket.socket() as listening:  # something accepts: the probe passes (ray.init then says the rest)
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        probe(f"ray://127.0.0.1:{listening.getsockname()[1]}", timeout=5)
        other_digits = str(listening.getsockname()[1]).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
        with pytest.raises(RayClusterError, match="expected HOST:PORT"):  # int() reads them; the probe passed
            probe(f"127.0.0.1:{other_digits}", timeout=5)
    probe("local")  # Ray resolves these itself
