"""Small, download-free examples used by ``configs/`` and the tests."""
