package seaweedfs

// SocketForTest is the control socket the driver gives a mount at target.
var SocketForTest = socketFor
