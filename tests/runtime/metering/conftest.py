from escrow_support import bank

__all__ = ["bank"]
