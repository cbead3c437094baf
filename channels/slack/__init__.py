"""The slack channel: parsing (pure), the adapter and the outbound half."""
