"""Helpers shared by tests of several apps that are neither fixtures nor one app's factories."""
