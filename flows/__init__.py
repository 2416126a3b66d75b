"""Prefect flows: the readable plans of gymflow's runs."""
