"""The backend-authoring kit: declarative rules, known issues and caveats, used by the built-in backends and
usable by third-party ones.
"""

from moedispatch.kit.rules import Combo, RuleBackend, need_feature

__all__ = ["Combo", "RuleBackend", "need_feature"]
