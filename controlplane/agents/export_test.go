package agents

// SignedPresenceForTest is a presence record for machineID naming replica,
// signed with r's replica secret as if that replica had written it.
func (r *Registry) SignedPresenceForTest(machineID, replica, transport string) []byte {
	return encodePresence(r.auth, machineID, presenceRecord{Replica: replica, Transport: transport})
}
