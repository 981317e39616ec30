"""What runs a node fast: attention resources, plan cache, workspace, compile modes, warmup."""
