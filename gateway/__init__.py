"""The contract every provider meets, and what the engine needs to use one.

Providers (`providers/*`) implement `gateway.contract.Provider`; the engine reaches them only
through `gateway.registry`, which imports a provider by name when it is first used.
"""
