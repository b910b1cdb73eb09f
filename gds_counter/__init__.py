"""gds_counter: a php-gds style mapper for Google Cloud Datastore, and a
sharded counter that PHP and Python apps can share."""

__version__ = "0.1.0"
