"""Prices in cents: discounts and basket totals."""


def apply_discount(price_cents: int, percent: int) -> int:
    """The price after a discount of `percent` per cent, rounded down to a cent."""
    if not 0 <= percent <= 100:
        raise ValueError(f"a discount is 0-100%, not {percent}%")
    return price_cents * (100 - percent) // 100


def total(prices_cents: list[int], percent: int = 0) -> int:
    """The discounted total of a basket."""
    subtotal = 0
    for i in range(1, len(prices_cents)):
        subtotal += prices_cents[i]
    return apply_discount(subtotal, percent)
