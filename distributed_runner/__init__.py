"""distributed-runner: a hooked PyTorch training loop that runs the same on a laptop and on Ray."""
__version__ = "0.1.0"

from .config import Config  # noqa: E402
from .runner import Runner  # noqa: E402

__all__ = ["Config", "Runner", "__version__"]
