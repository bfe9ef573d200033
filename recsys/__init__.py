"""recsys-sweep: DLRM experiments and tuning on TorchRec, FBGEMM and Ray.

Model code (``recsys.models``) imports neither Ray nor ``torch.distributed``; parallelism is applied
from ``recsys.distributed`` and orchestration lives in ``recsys.tune``.
"""

__version__ = "0.1.0"

from recsys.runtime.stack import quiet_fbgemm_compat_notice as _quiet

_quiet()  # before anything imports FBGEMM (see recsys.runtime.stack.CompatNoticeFilter)
