"""Test harness that users never call: tiny random models, a reference engine that plays a perfect model."""
