package tunnel_test

func reconcileNetns() {}
