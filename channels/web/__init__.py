"""The web channel: parsing (pure), the adapter and the outbound half."""
