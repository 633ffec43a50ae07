"""Which GPUs a deployment runs on: `sm120 launch A --gpus 0,1` pins the engine to a GPU set
(CUDA_VISIBLE_DEVICES natively, the device ids of the container's GPU request in Docker), so
two recipes can run side by side on disjoint sets."""
