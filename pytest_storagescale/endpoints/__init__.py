"""Where the storage under test is: endpoint URLs, the run's test area, and the
embedded XRootD server started when no ``--storage-endpoint`` is given."""

from .url import EndpointURL

__all__ = ["EndpointURL"]
