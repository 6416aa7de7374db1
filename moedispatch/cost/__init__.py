"""The cost model: predicted fused-MoE time per layer and token count, with error bars.

``from moedispatch.cost import Cost`` is public (a plugin answering ``moe_cost`` returns it).
"""

from moedispatch.cost.model import predict
from moedispatch.cost.ranking import total
from moedispatch.core.costs import Cost, format_cost

__all__ = ["Cost", "format_cost", "predict", "total"]
