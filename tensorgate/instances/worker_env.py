"""The environment a worker process gets: the server's, less anything that looks like a credential.

A model is code and runs with the server's privileges (S-06); a worker needs no cloud credentials
or tokens to run it, so a model that was tampered with finds none to steal (TorchServe's
``blacklist_env_vars`` does the same). Device, threading and Python settings pass through.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Cloud providers' credential variables, and any name that says it holds a secret.
_CREDENTIAL = re.compile(
    r"^(AWS_|AZURE_|ARM_CLIENT|GOOGLE_|GCP_|GCLOUD_|CLOUDSDK_|ALIBABA_CLOUD_|OCI_|DO_|VAULT_)"
    r"|TOKEN|SECRET|PASSW|CREDENTIAL|API_KEY|APIKEY|PRIVATE_KEY|ACCESS_KEY",
    re.IGNORECASE,
)


def worker_environment(environment: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in environment.items() if not _CREDENTIAL.search(name)}
