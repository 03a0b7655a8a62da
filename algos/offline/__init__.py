"""Offline RL: algorithms that learn from a ``robotrl.data.Dataset`` with no simulator in the
loop (the ``offline`` runner evaluates them in one)."""

from robotrl.algos.offline.awac import AWAC, AWACConfig
from robotrl.algos.offline.bc import BC, BCConfig
from robotrl.algos.offline.cql import CQL, CQLConfig
from robotrl.algos.offline.iql import IQL, IQLConfig
from robotrl.algos.offline.mcep import AWACMCEP, TD3BCMCEP, AWACMCEPConfig, TD3BCMCEPConfig
from robotrl.algos.offline.rebrac import ReBRAC, ReBRACConfig
from robotrl.algos.offline.td3bc import TD3BC, TD3BCConfig

__all__ = ["AWAC", "AWACMCEP", "BC", "CQL", "IQL", "TD3BC", "TD3BCMCEP", "AWACConfig",
           "AWACMCEPConfig", "BCConfig", "CQLConfig", "IQLConfig", "ReBRAC", "ReBRACConfig",
           "TD3BCConfig", "TD3BCMCEPConfig"]
