"""Bad-input fuzzing of the gateway with hypothesis."""
