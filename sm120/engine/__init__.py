"""Running engines: deployment state on disk, the Docker door, the engine environment,
GPU readings, runtimes (native, Docker) and multi-node processes (cluster/)."""
