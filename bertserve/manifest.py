"""The manifest schema's former home: everything now lives in `bertserve.repository`, the repository contract.

Kept so that `from bertserve.manifest import Manifest, ENCODER, sha256_file` keeps working; new code imports
`bertserve.repository`.
"""

from bertserve.repository import *  # noqa: F403
from bertserve.repository import __all__  # noqa: F401
