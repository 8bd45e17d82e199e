"""What users install, run as they run it: the container image and the release files.

``make image-test`` names the image in ``TENSORGATE_IMAGE`` (and the Docker client in ``DOCKER``);
``make dist-test`` names the folder of the sdist and wheels in ``TENSORGATE_DIST``. Without them
these tests are not collected at all, so ``make test`` needs neither a Docker engine nor a build.
"""

from __future__ import annotations

import os

collect_ignore = []
if not os.environ.get("TENSORGATE_IMAGE"):
    collect_ignore += ["test_image.py", "test_image_replicas.py"]
if not os.environ.get("TENSORGATE_DIST"):
    collect_ignore += ["test_wheel.py"]
