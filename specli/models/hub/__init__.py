"""Model files from the Hugging Face Hub: resolve, pull, report and remove. The only importer of huggingface_hub.

Files live in the standard Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`), so other tools reuse them.
`download` resolves a pair to local paths, plans and pulls; `refs` does the same for a Hub reference
(`owner/repo:QUANT`); `repo` reads a repo's file list, `check` holds the registry against it; `cache`
reports and removes what is on disk.
"""

from specli.models.hub.cache import (  # noqa: F401 (the package's interface)
    PairStatus,
    Removal,
    format_size,
    free_space,
    hub_cache_dir,
    pair_status,
    plan_removal,
    remove_files,
)
from specli.models.hub.check import CheckReport, check_pairs  # noqa: F401
from specli.models.hub.download import PullPlan, plan_pull, pull_pair, resolve_model, resolve_pair  # noqa: F401
from specli.models.hub.refs import cached_reference, parse_reference, projector_for, resolve_reference  # noqa: F401
