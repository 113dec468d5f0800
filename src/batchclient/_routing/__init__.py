"""The replica router, shared by every provider that spreads requests over replicas.

- :mod:`.dispatch`: replicas, their (replica, model) lanes and the ``Dispatcher`` that hands
  out request slots (least-loaded, FIFO waiters, throttle pauses, ejection and readmission);
- :mod:`.adaptive`: each lane's adaptive concurrency limit; :mod:`.rates`: rpm/tpm buckets;
  :mod:`.quota`: pacing from a server's announced ``x-ratelimit-*`` quota;
- :mod:`.retry`: what is retried and how long to wait (tenacity);
- :mod:`.settings`: the policies (``AdaptiveConcurrency``, ``RetryPolicy``, ``RateLimits``,
  ``Ejection``), re-exported by ``batchclient.remote``.

The remote provider routes HTTP requests with it, the Ray provider requests to engine actors,
the Batch API client retries with its policy. Nothing here knows about HTTP or Ray: a replica's
``pool`` is whatever its provider sends with.
"""
