"""Arithmetic tasks solved with a calculator tool."""

from toolrl.envs.calculator.env import CalculatorEnv

__all__ = ["CalculatorEnv"]
