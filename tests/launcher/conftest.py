import pytest


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory):
    """A fresh Hugging Face cache holding only the converted demo model."""
    from launcher.demo_model import ensure_demo_model

    cache = tmp_path_factory.mktemp("hf-cache")
    ensure_demo_model(cache)
    return cache


@pytest.fixture(scope="session")
def demo_snapshot(demo_cache):
    from launcher.demo_model import ensure_demo_model

    return ensure_demo_model(demo_cache)
